"""What a single sign-on makes in the store, on SQLite and on a real PostgreSQL: the user of
an (issuer, subject), whatever the issuer URL's length (PostgreSQL enforces the columns'
lengths, SQLite does not); the group → role mapping brought up to date at each sign-in,
roles given by hand never lowered, a workspace's last owner kept."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from batchyard.server.services import identities, roles
from batchyard.server.sso import signin
from batchyard.server.sso.settings import OidcSettings
from batchyard.store.db import Database
from batchyard.store.identity import RoleAssignment, User
from batchyard.store.models import Workspace

AZURE = "https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0"


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    else:
        maker: Callable[[], str] = request.getfixturevalue("postgres_database")
        url = maker()
    found = Database(url)
    found.migrate()
    with found.session() as s:
        for name in ("research", "vision"):
            s.add(Workspace(name=name))
    yield found
    found.engine.dispose()


def who(subject: str = "a1", groups: tuple[str, ...] = (), issuer: str = AZURE
        ) -> signin.Identity:
    return signin.Identity(issuer=issuer, subject=subject, name_hint="alice",
                           email="alice@example.org", groups=groups)


def settings(*group_roles: tuple[str, str, str], admin: tuple[str, ...] = ()) -> OidcSettings:
    return OidcSettings(issuer=AZURE, client_id="batchyard", admin_groups=admin,
                        group_roles=group_roles)


def roles_of(db: Database, name: str) -> dict[str, tuple[str, str | None]]:
    with db.session() as s:
        user = identities.find_user(s, name)
        rows = s.execute(select(Workspace.name, RoleAssignment.role, RoleAssignment.created_by)
                         .join(Workspace, Workspace.id == RoleAssignment.workspace_id)
                         .where(RoleAssignment.user_id == user.id))
        return {ws: (role, by) for ws, role, by in rows}


def test_a_long_issuer_url_makes_a_user(db: Database) -> None:
    """Regression: the user's and the mapped roles' ``created_by`` (64 characters) held
    "sso:<issuer>", which PostgreSQL refused for Azure's issuer URLs (a 500 at the first
    sign-in)."""
    conf = settings(("ml", "research", "reader"), admin=("admins",))
    with db.session() as s:
        user = signin.sign_in(s, conf, who(groups=("ml", "admins")))
        assert user.admin and user.issuer == AZURE
    with db.session() as s:
        identities.sso_user(s, issuer=AZURE, subject="b2", name_hint="bob", email=None,
                            groups=["ml"], group_roles={"ml": [("research", "reader")]})
    assert roles_of(db, "alice") == {"research": ("reader", "sso")}
    assert roles_of(db, "bob") == {"research": ("reader", "sso")}


def test_the_mapping_follows_the_groups_at_each_sign_in(db: Database) -> None:
    conf = settings(("ml", "research", "contributor"), ("viewers", "vision", "reader"),
                    ("leads", "vision", "owner"))
    with db.session() as s:
        signin.sign_in(s, conf, who(groups=("ml", "viewers")))
    assert roles_of(db, "alice") == {"research": ("contributor", "sso"),
                                     "vision": ("reader", "sso")}
    with db.session() as s:  # now a lead, and out of ml
        signin.sign_in(s, conf, who(groups=("viewers", "leads")))
    assert roles_of(db, "alice") == {"vision": ("owner", "sso")}
    with db.session() as s:  # out of every group: the last owner of vision stays
        signin.sign_in(s, conf, who(groups=()))
    assert roles_of(db, "alice") == {"vision": ("owner", "sso")}


def test_a_role_given_by_hand_is_raised_never_lowered(db: Database) -> None:
    conf = settings(("ml", "research", "contributor"))
    with db.session() as s:
        signin.sign_in(s, conf, who())
        roles.assign(s, "research", user="alice", role="reader", by="admin")
        roles.assign(s, "vision", user="alice", role="owner", by="admin")
    with db.session() as s:
        signin.sign_in(s, conf, who(groups=("ml",)))
    assert roles_of(db, "alice") == {"research": ("contributor", "admin"),
                                     "vision": ("owner", "admin")}
    with db.session() as s:
        signin.sign_in(s, conf, who(groups=()))
    assert roles_of(db, "alice") == {"research": ("contributor", "admin"),
                                     "vision": ("owner", "admin")}


def test_a_workspace_that_does_not_exist_is_skipped(db: Database) -> None:
    with db.session() as s:
        signin.sign_in(s, settings(("ml", "nowhere", "reader")), who(groups=("ml",)))
    assert roles_of(db, "alice") == {}


def test_the_same_person_twice_is_one_user(db: Database) -> None:
    conf = settings()
    with db.session() as s:
        first = signin.sign_in(s, conf, who()).id
    with db.session() as s:
        again = signin.sign_in(s, conf, who())
        assert again.id == first
    with db.session() as s:  # another issuer's "a1" is someone else
        other = signin.sign_in(s, conf, who(issuer="https://accounts.example.org"))
        assert other.id != first and other.name == "alice-2"
    with db.session() as s:
        assert len(list(s.scalars(select(User.id)))) == 2

