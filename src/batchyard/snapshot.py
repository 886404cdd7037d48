"""Code snapshots: a directory packed at submit time, so a job runs the code as it was then
(even if the user edits it while the job waits). Content-addressed, so resubmitting the same
code stores nothing new."""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import tarfile
from pathlib import Path

from batchyard.errors import SpecError

DEFAULT_LIMIT = 300 * 1024 * 1024
ALWAYS_SKIP = {".git", "__pycache__", ".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache",
               ".ipynb_checkpoints"}


def _patterns(root: Path) -> list[str]:
    """.amlignore wins over .gitignore, as in Azure ML."""
    for name in (".amlignore", ".gitignore"):
        path = root / name
        if path.is_file():
            lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()]
            return [ln for ln in lines if ln and not ln.startswith("#")]
    return []


def _ignored(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    ignored = False
    name = rel.rsplit("/", 1)[-1]
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        dir_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        if dir_only and not is_dir:
            continue
        anchored = pattern.startswith("/") or "/" in pattern
        pattern = pattern.lstrip("/")
        hit = fnmatch.fnmatch(rel, pattern) if anchored else fnmatch.fnmatch(name, pattern)
        if hit:
            ignored = not negate
    return ignored


def _refuse_hidden(directory: str | Path) -> None:
    """``code:`` is packed by whoever submits (the CLI, the SDK, the server): never the
    home of batchyard (its token, database, secret key, TLS keys), even through a link
    (batchyard/pathguard.py; the server checks its own folders too)."""
    from batchyard import pathguard

    given = os.environ.get("BATCHYARD_HOME")
    hidden = [given or str(Path.home() / ".batchyard"), str(Path.home() / ".batchyard"),
              os.environ.get("BATCHYARD_DATA_ROOT") or ""]
    try:
        pathguard.check(str(directory), "code", [h for h in hidden if h])
    except pathguard.PathRefused as exc:
        raise SpecError(exc.message, details=[{"field": "code",
                                               "message": "reaches a hidden folder"}]) from None


def pack(directory: str | Path, limit: int = DEFAULT_LIMIT) -> bytes:
    _refuse_hidden(directory)
    root = Path(directory).resolve()
    if not root.is_dir():
        raise SpecError(f"code: {directory} is not a directory")
    patterns = _patterns(root)
    files: list[tuple[Path, str]] = []
    total = 0
    for current, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(current, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(
            d for d in dirnames
            if d not in ALWAYS_SKIP and not _ignored(rel_dir + d, True, patterns)
        )
        for name in sorted(filenames):
            rel = rel_dir + name
            if _ignored(rel, False, patterns):
                continue
            path = Path(current) / name
            if path.is_symlink() or not path.is_file():
                continue
            total += path.stat().st_size
            if total > limit:
                raise SpecError(
                    f"code: {root} is larger than the snapshot limit of {limit // (1024 * 1024)} "
                    "MiB; list data and outputs in .amlignore or .gitignore, or use inputs"
                )
            files.append((path, rel))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for path, rel in files:
            info = tar.gettarinfo(str(path), arcname=rel)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
    return buf.getvalue()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
