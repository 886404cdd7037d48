"""Submit-time side of the path check (batchyard/pathguard.py): the folders no job may name
on this server, and every local path of a job spec checked against them, in every format
(native YAML, Batch AI job.json and AML v2 all become the one spec checked here), for jobs,
array members and sweep trials alike. The node checks again once it has resolved them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard import pathguard
from batchyard.config import data_root, home
from batchyard.errors import SpecError
from batchyard.store.models import Cluster, Node


@dataclass(frozen=True)
class Roots:
    hidden: tuple[str, ...]
    allowed: tuple[str, ...]  # areas inside them a job may name (its workspace's datastores)

    def check(self, path: str, field: str, base: str | None = None) -> str:
        """The resolved path, or a SpecError naming ``field`` (HTTP 422, CLI exit 2)."""
        if pathguard.climbs(path) and base is None:
            raise SpecError(f"{field}: {path} climbs out of the job's folder ('..'): give an "
                            "absolute path", details=[{"field": field, "message": "'..'"}])
        try:
            return pathguard.check(path, field, self.hidden, allowed=self.allowed, base=base)
        except pathguard.PathRefused as exc:
            raise SpecError(exc.message, details=[{"field": field,
                                                   "message": "reaches a hidden folder"}]
                            ) from None


def roots(session: Session, workspace: str, tls_files: tuple[str, ...] = ()) -> Roots:
    """The server's home and data root, the default home of its user, every node's work
    folder (agents', Slurm's, Ray's), the TLS key and the clusters' token files."""
    hidden = [str(home()), str(data_root()), str(Path.home() / ".batchyard"), *tls_files]
    hidden += [d for d in session.scalars(select(Node.directory).distinct()) if d]
    for spec in session.scalars(select(Cluster.spec)):
        if isinstance(spec, dict) and spec.get("ray_token_file"):
            hidden.append(str(spec["ray_token_file"]))
    allowed = (str(data_root() / "datastores" / workspace),)
    return Roots(tuple(dict.fromkeys(hidden)), allowed)


def _local(path: Any) -> bool:
    """A path on a machine's disk (not a datastore, a URL, a variable to expand)."""
    text = str(path or "")
    return bool(text) and ("://" not in text or text.startswith("file://")) \
        and not text.startswith(("azureml:", "$", "snapshot:"))


def local_paths(spec: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, path) of every local path the spec names (a stored, dumped spec)."""
    out: list[tuple[str, str]] = []
    for ident, item in (spec.get("inputs") or {}).items():
        if _local(item.get("path")):
            out.append((f"inputs.{ident}.path", str(item["path"])))
    for i, mount in enumerate(spec.get("mounts") or []):
        if mount.get("kind", "local") == "local" and _local(mount.get("source")):
            out.append((f"mounts[{i}].source", str(mount["source"])))
    for ident, item in (spec.get("outputs") or {}).items():
        if _local(item.get("path_prefix")):
            out.append((f"outputs.{ident}.path_prefix", str(item["path_prefix"])))
    if _local(spec.get("stdouterr_path_prefix")):
        out.append(("stdouterr_path_prefix", str(spec["stdouterr_path_prefix"])))
    code = spec.get("code")
    if _local(code) and os.path.isabs(str(code)):
        out.append(("code", str(code)))
    return out


def check_spec(session: Session, workspace: str, spec: dict[str, Any],
               tls_files: tuple[str, ...] = ()) -> None:
    """Refuse the first local path of ``spec`` that reaches a hidden folder."""
    found = local_paths(spec)
    if not found:
        return
    where = roots(session, workspace, tls_files)
    for field, path in found:
        if pathguard.climbs(path):
            where.check(path, field)  # (refused: relative to what, on a node?)
        elif os.path.isabs(path.removeprefix("file://")):
            where.check(path, field)


def check_datastore_path(session: Session, workspace: str, root: str, sub: str,
                         field: str) -> None:
    """A path inside a local datastore: it stays inside the datastore's folder (no ``..``,
    no link out of it), and that folder reaches no hidden one (a datastore registered on
    the server's home would hand out its token)."""
    inside = pathguard.resolve(os.path.join(root, sub.strip("/")))
    top = pathguard.resolve(root)
    if not pathguard.within(inside, top):
        raise SpecError(f"{field}: {sub!r} leaves its datastore's folder",
                        details=[{"field": field, "message": "leaves the datastore"}])
    roots(session, workspace).check(inside, field)
