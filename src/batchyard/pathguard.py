"""One check for every path a job names (a ``path`` input, a local mount's ``source``, a
``code`` folder, a datastore path, an output's or the logs' path prefix): it is refused when
it resolves into a *hidden root* (the server's home, its data root, an agent's work folder, a
credential file) or when one lies inside it (``/`` would show them all).

The server runs it at submit, against the roots it knows (services/pathcheck.py); the node's
launcher runs it again once the path is resolved there (node/sandbox.py), against the roots
its sandbox hides. Links are followed before the comparison, so a link planted on the way
counts for where it leads. Standard library only: the launcher imports it under ``-S``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

WHAT = "(the server's home or data, an agent's work folder, a credential)"


class PathRefused(ValueError):
    """A path a job named reaches a hidden root; ``field`` names where it was given."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def within(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies under it (both absolute and normalised)."""
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


def resolve(path: str, base: str | None = None) -> str:
    """Absolute, links followed (as far as the path exists), ``..`` folded."""
    text = path.removeprefix("file://")
    if not os.path.isabs(text):
        text = os.path.join(base or os.getcwd(), text)
    return os.path.realpath(text)


def _roots(paths: Iterable[str]) -> list[str]:
    out = []
    for path in paths:
        if path:
            out += list(dict.fromkeys((os.path.normpath(path), os.path.realpath(path))))
    return out


def reaches(path: str, hidden: Iterable[str], allowed: Iterable[str] = ()) -> str | None:
    """The hidden root the resolved ``path`` reaches, else None: one it lies in (unless it
    lies in an ``allowed`` area there, such as the job's own directories), or one inside it."""
    roots, areas = _roots(hidden), _roots(allowed)
    for root in roots:
        if within(path, root) and not any(within(path, a) for a in areas):
            return root
        if within(root, path) and root != path and not any(within(root, a) for a in areas):
            return root
    return None


def check(path: str, field: str, hidden: Iterable[str], *, allowed: Iterable[str] = (),
          base: str | None = None) -> str:
    """The resolved ``path``, or PathRefused naming ``field``."""
    found = resolve(path, base)
    if reaches(found, hidden, allowed) is not None:
        shown = path if found == os.path.normpath(path) else f"{path} (resolves to {found})"
        raise PathRefused(field, f"{field}: {shown} reaches a folder no job may reach {WHAT}")
    return found


def climbs(path: str) -> bool:
    """A relative path that leaves the folder it is taken from (``../x``)."""
    text = path.removeprefix("file://")
    if os.path.isabs(text):
        return False
    norm = os.path.normpath(text)
    return norm == ".." or norm.startswith("../")
