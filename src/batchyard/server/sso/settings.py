"""Single sign-on's settings, as `batchyard server start --oidc-…` gives them.

They travel as command-line flags to the detached server (``argv``) and as a dict to each
worker of a ``--workers`` server (``to_spec``/``from_spec``), so that every process signs
people in the same way. The client secret never travels: only its file's path does, and
each process reads the file when it starts (``secret``)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from batchyard.errors import SpecError

GROUP_ROLE = re.compile(r"^(?P<group>[^=]+)=(?P<ws>[A-Za-z0-9][A-Za-z0-9_.-]{0,63}):"
                        r"(?P<role>[a-z]+)$")
ROLES = ("reader", "contributor", "owner")
MAX_SECRET = 4096
LOGIN_LIFETIME = 7 * 86400.0
MAX_LOGIN_LIFETIME = 90 * 86400.0


@dataclass(frozen=True)
class OidcSettings:
    """``issuer``: the provider's issuer URL (https, or http on loopback); ``client_id``:
    this server's client at the provider; ``secret_file``: the client secret's file (None:
    a public client); ``admin_groups``: members of any of these (the ``groups`` claim) are
    server admins; ``group_roles``: (group, workspace, role) — members of the group hold at
    least that role in that workspace; ``login_lifetime``: seconds a CLI's sign-in lasts."""

    issuer: str
    client_id: str
    secret_file: str | None = None
    admin_groups: tuple[str, ...] = ()
    group_roles: tuple[tuple[str, str, str], ...] = ()
    login_lifetime: float = LOGIN_LIFETIME
    _secret: list[str] = field(default_factory=list, repr=False, compare=False)

    @property
    def secret(self) -> str | None:
        """The client secret (read once per process; never logged or shown)."""
        if self.secret_file is None:
            return None
        if not self._secret:
            self._secret.append(read_secret(self.secret_file))
        return self._secret[0]

    def roles_by_group(self) -> dict[str, list[tuple[str, str]]]:
        found: dict[str, list[tuple[str, str]]] = {}
        for group, workspace, role in self.group_roles:
            found.setdefault(group, []).append((workspace, role))
        return found

    def argv(self) -> list[str]:
        """The flags of ``python -m batchyard.server`` that give these settings."""
        args = ["--oidc-issuer", self.issuer, "--oidc-client-id", self.client_id]
        if self.secret_file:
            args += ["--oidc-client-secret-file", self.secret_file]
        for group in self.admin_groups:
            args += ["--oidc-admin-group", group]
        for group, workspace, role in self.group_roles:
            args += ["--oidc-group-role", f"{group}={workspace}:{role}"]
        if self.login_lifetime != LOGIN_LIFETIME:
            args += ["--oidc-login-lifetime", f"{self.login_lifetime:g}"]
        return args

    def to_spec(self) -> dict[str, Any]:
        return {"issuer": self.issuer, "client_id": self.client_id,
                "secret_file": self.secret_file, "admin_groups": list(self.admin_groups),
                "group_roles": [list(r) for r in self.group_roles],
                "login_lifetime": self.login_lifetime}

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> OidcSettings:
        return cls(issuer=str(spec["issuer"]), client_id=str(spec["client_id"]),
                   secret_file=spec.get("secret_file"),
                   admin_groups=tuple(spec.get("admin_groups") or ()),
                   group_roles=tuple((str(g), str(w), str(r))
                                     for g, w, r in spec.get("group_roles") or ()),
                   login_lifetime=float(spec.get("login_lifetime") or LOGIN_LIFETIME))


def parse(issuer: str | None, client_id: str | None, secret_file: str | None = None,
          admin_groups: Sequence[str] | None = None,
          group_roles: Sequence[str] | None = None,
          login_lifetime: str | None = None) -> OidcSettings | None:
    """The settings of the ``--oidc-…`` flags (None: single sign-on is off); a bad value
    raises SpecError naming its flag."""
    extras = [flag for flag, value in (("--oidc-client-id", client_id),
                                       ("--oidc-client-secret-file", secret_file),
                                       ("--oidc-admin-group", admin_groups),
                                       ("--oidc-group-role", group_roles),
                                       ("--oidc-login-lifetime", login_lifetime)) if value]
    if not issuer:
        if extras:
            raise SpecError(f"{extras[0]} needs --oidc-issuer (the OpenID provider's URL)")
        return None
    if not client_id or not client_id.strip():
        raise SpecError("--oidc-issuer needs --oidc-client-id (this server's client id at "
                        "the provider)")
    path = None
    if secret_file:
        path = str(Path(secret_file).expanduser().resolve())
        read_secret(path)
    return OidcSettings(issuer=check_issuer(issuer), client_id=client_id.strip(),
                        secret_file=path, admin_groups=tuple(_groups(admin_groups or ())),
                        group_roles=tuple(parse_group_role(v) for v in group_roles or ()),
                        login_lifetime=_lifetime(login_lifetime))


def _lifetime(value: str | None) -> float:
    if value is None:
        return LOGIN_LIFETIME
    from batchyard.spec.durations import parse_duration

    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise SpecError(f"--oidc-login-lifetime {value!r}: {exc}") from None
    if not 60 <= seconds <= MAX_LOGIN_LIFETIME:
        raise SpecError(f"--oidc-login-lifetime {value!r}: between a minute and 90 days")
    return seconds


def check_issuer(value: str) -> str:
    """An issuer URL: https, or plain http only on loopback (a provider on this machine);
    no query or fragment (OpenID Connect Discovery 1.0, section 2)."""
    issuer = value.strip()
    parts = urlsplit(issuer)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecError(f"--oidc-issuer {value!r}: the provider's issuer URL, e.g. "
                        "https://login.example.org/realms/ml")
    if parts.query or parts.fragment:
        raise SpecError(f"--oidc-issuer {value!r}: an issuer URL has no query or fragment")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        raise SpecError(f"--oidc-issuer {value!r}: use https (plain http is only for a "
                        "provider on this machine's loopback)")
    return issuer


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_group_role(value: str) -> tuple[str, str, str]:
    """``GROUP=WORKSPACE:ROLE`` (the group may hold ``:`` and spaces, the workspace not)."""
    found = GROUP_ROLE.match(value.strip()) if isinstance(value, str) else None
    if found is None or not found["group"].strip():
        raise SpecError(f"--oidc-group-role {value!r}: expected GROUP=WORKSPACE:ROLE, e.g. "
                        "ml-team=research:contributor")
    if found["role"] not in ROLES:
        raise SpecError(f"--oidc-group-role {value!r}: {found['role']!r} is not a role; one "
                        f"of {', '.join(ROLES)}")
    return found["group"].strip(), found["ws"], found["role"]


def _groups(values: Iterable[str]) -> list[str]:
    groups = [v.strip() for v in values]
    if not all(groups):
        raise SpecError("--oidc-admin-group: a group name, not an empty string")
    return groups


def read_secret(path: str) -> str:
    """The client secret in ``path`` (its first line, stripped)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(MAX_SECRET + 1)
    except OSError as exc:
        raise SpecError(f"--oidc-client-secret-file {path}: cannot be read "
                        f"({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise SpecError(f"--oidc-client-secret-file {path}: not a text file") from None
    secret = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not secret or len(text) > MAX_SECRET:
        raise SpecError(f"--oidc-client-secret-file {path}: expected the client secret on "
                        "one line")
    return secret

