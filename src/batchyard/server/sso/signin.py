"""From a provider's tokens to a batchyard user: the ID token verified, the user's claims
(the ID token's, completed by userinfo: many providers put only ``sub`` in the ID token),
the user found by (issuer, subject) or made on the first login, their admin flag and
mapped roles brought up to date from the ``groups`` claim, and a credential issued.

The group → role mapping applies at each login. A role the mapping granted (an assignment
made by single sign-on) follows the user's groups: raised, lowered or removed with them
(except a workspace's last owner, which stays). A role assigned by hand is only ever
raised by the mapping, never lowered or removed."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from batchyard.errors import AuthError
from batchyard.server.security import cache
from batchyard.server.security.authn import Refused
from batchyard.server.security.principal import Role
from batchyard.server.sso import idtoken
from batchyard.server.sso.provider import Provider
from batchyard.server.sso.settings import OidcSettings
from batchyard.store.identity import RoleAssignment, User
from batchyard.store.models import Workspace, now

SSO = "sso"  # created_by of what single sign-on makes (users, role assignments)
MAX_GROUPS = 500
log = logging.getLogger("batchyard.sso")


@dataclass(frozen=True)
class Identity:
    """Who the provider says signed in."""

    issuer: str
    subject: str
    name_hint: str | None
    email: str | None
    groups: tuple[str, ...]


def identity(issuer: str, claims: Mapping[str, Any],
             userinfo: Mapping[str, Any] | None = None) -> Identity:
    """The signed-in user from the ID token's claims, and userinfo's for those it lacks
    (userinfo counts only when it names the same subject: OIDC Core 5.3.2)."""
    merged = dict(claims)
    if userinfo and userinfo.get("sub") == claims.get("sub"):
        merged.update({k: v for k, v in userinfo.items() if k not in ("sub", "iss", "aud")})
    email = merged.get("email")
    email = email if isinstance(email, str) and 3 <= len(email) <= 255 else None
    hint = next((v for v in (merged.get("preferred_username"),
                             email.split("@")[0] if email else None, merged.get("name"),
                             claims.get("sub"))
                 if isinstance(v, str) and v.strip()), None)
    return Identity(issuer=issuer, subject=str(claims["sub"]), name_hint=hint, email=email,
                    groups=groups_of(merged.get("groups")))


def groups_of(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return ()
    return tuple(dict.fromkeys(str(g) for g in value[:MAX_GROUPS]
                               if isinstance(g, str | int) and str(g)))


def from_tokens(provider: Provider, answer: Mapping[str, Any], *, nonce: str | None,
                nonce_required: bool) -> Identity:
    """The identity a token endpoint's answer proves (its ID token verified)."""
    token = answer.get("id_token")
    if not isinstance(token, str) or not token:
        raise AuthError("the OpenID provider answered without an ID token: is 'openid' "
                        "among the scopes its client may ask for? (ask the server's admin)")
    claims = verify(provider, token, nonce=nonce, nonce_required=nonce_required)
    access = answer.get("access_token")
    userinfo = provider.userinfo(access) if isinstance(access, str) else {}
    return identity(provider.issuer, claims, userinfo)


def verify(provider: Provider, token: str, *, nonce: str | None = None,
           nonce_required: bool = False) -> dict[str, Any]:
    return idtoken.verify(token, keys=provider.keys, issuer=provider.issuer,
                          client_id=provider.settings.client_id,
                          algorithms=provider.algorithms(), nonce=nonce,
                          nonce_required=nonce_required)


def sign_in(session: Session, settings: OidcSettings, who: Identity) -> User:
    """The user ``who`` is, made on the first login, admin and roles as their groups say
    now. A disabled user (or a service account) is refused (``Refused``: audited and
    counted against the caller's address)."""
    from batchyard.server.services.identities import sso_user

    for last in (False, True):  # a first sign-in of the same person elsewhere meanwhile:
        try:                    # the second finds the first's user
            with session.begin_nested():
                user = sso_user(session, issuer=who.issuer, subject=who.subject,
                                name_hint=who.name_hint, email=who.email, groups=who.groups,
                                admin_groups=settings.admin_groups)
            break
        except IntegrityError:
            if last:
                raise
    if user.disabled_at is not None:
        raise Refused(f"user {user.name!r} is disabled: ask a server admin "
                      "(`batchyard user enable`)", user.name, SSO)
    if user.service:
        raise Refused(f"{user.name!r} is a service account: it cannot sign in "
                      "interactively", user.name, SSO)
    sync_roles(session, user, who.groups, settings.roles_by_group())
    return user


def issue(session: Session, settings: OidcSettings, user: User, via: str) -> dict[str, Any]:
    """A login token for a CLI signed in by single sign-on (`batchyard logout` revokes it;
    it expires after ``login_lifetime``)."""
    from batchyard.server.services import tokens

    return tokens.issue(session, user, name=f"sso-{via}", expires=settings.login_lifetime,
                        kind="login", by=SSO)


def sync_roles(session: Session, user: User, groups: Iterable[str],
               mapping: Mapping[str, list[tuple[str, str]]]) -> None:
    wanted: dict[str, Role] = {}
    for group in groups:
        for workspace, name in mapping.get(group, ()):
            wanted[workspace] = max(wanted.get(workspace, Role.reader), Role[name])
    holder = f"user:{user.id}"
    held = {name: row for row, name in session.execute(
        select(RoleAssignment, Workspace.name).join(
            Workspace, Workspace.id == RoleAssignment.workspace_id).where(
            RoleAssignment.holder == holder))}
    changed = False
    for workspace, role in wanted.items():
        row = held.get(workspace)
        if row is None:
            ws_id = session.scalar(select(Workspace.id).where(Workspace.name == workspace))
            if ws_id is None:
                log.warning("--oidc-group-role names workspace %r, which does not exist: "
                            "skipped for %s", workspace, user.name)
                continue
            session.add(RoleAssignment(workspace_id=ws_id, holder=holder, user_id=user.id,
                                       role=role.name, created_at=now(), created_by=SSO))
            changed = True
        elif Role[row.role] < role or (row.created_by == SSO and Role[row.role] > role
                                       and not _last_owner(session, row)):
            row.role = role.name
            changed = True
    for workspace, row in held.items():
        if workspace not in wanted and row.created_by == SSO and not _last_owner(session, row):
            session.delete(row)
            changed = True
    if changed:
        session.flush()
        cache.changed(session)


def _last_owner(session: Session, row: RoleAssignment) -> bool:
    if row.role != Role.owner.name:
        return False
    others = session.scalar(select(func.count()).select_from(RoleAssignment).where(
        RoleAssignment.workspace_id == row.workspace_id, RoleAssignment.role == "owner",
        RoleAssignment.id != row.id))
    return not others
