"""Who a request acts for, and the workspace roles (Azure's built-in names)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from batchyard.errors import SpecError


class Role(IntEnum):
    """Each role can do what the ones below it can: ``reader`` sees everything in its
    workspace; ``contributor`` submits jobs, and terminates and execs into its own;
    ``owner`` does that to anyone's jobs and manages the workspace's clusters, datastores
    and role assignments. Server admins are above every role, everywhere."""

    reader = 1
    contributor = 2
    owner = 3

    @classmethod
    def parse(cls, value: str, field_name: str = "role") -> Role:
        try:
            return cls[value.strip().lower()]
        except KeyError:
            raise SpecError(f"{field_name}: {value!r} is not a role; one of "
                            f"{', '.join(r.name for r in cls)}") from None


@dataclass(frozen=True)
class Principal:
    """A user (person or service account, by a personal token, the home's token or a
    portal session), or a job acting through its own job token. ``roles``: the user's
    effective role per workspace name (its own assignments and its teams')."""

    admin: bool = False
    job_id: int | None = None
    name: str = ""
    kind: str = "user"  # user | job
    user_id: int | None = None
    service: bool = False
    credential: str = ""  # how it signed in: home-token, token:<id>, session, job:<id>
    roles: Mapping[str, Role] = field(default_factory=dict)
    job_path: tuple[str, str, str] | None = None  # a job token's (workspace, exp, job)

    @property
    def is_user(self) -> bool:
        return self.kind == "user"

    def role_in(self, workspace: str) -> Role | None:
        """The role this principal holds in ``workspace`` (admins: above owner)."""
        if self.admin:
            return Role.owner
        return self.roles.get(workspace) if self.is_user else None

    def visible(self, workspace: str) -> bool:
        return self.role_in(workspace) is not None
