"""Whose uid a job runs as on a bare node whose launcher is root: one unprivileged uid per
submitting user, the same for every job of that user on this machine, so two users' jobs
cannot read each other's directories (their own are theirs, 0700) while one user's jobs
share what that user shares.

A uid comes from a range far above any real account (``BATCHYARD_JOB_UIDS``, default
1600000000-2147000000), picked by a hash of the user's name (so usually the same on every
machine: files on a shared file server keep their owner) and claimed in a host-wide
registry, one file per uid named after it (``BATCHYARD_JOB_UID_DIR``, default
``/var/lib/batchyard/job-uids``), created with ``link()`` so that two launchers can never
give one uid to two users: a taken uid moves the user to the next free one. Nothing is
added to the host's ``/etc/passwd``: the job's mount namespace shows a copy with the
job's account in it (``by-<user>``), so ``whoami``, ``getpass`` and ssh-free tools work.
Standard library only (the launcher runs under ``python -S``)."""

from __future__ import annotations

import contextlib
import os
import re
import zlib
from pathlib import Path

RANGE_ENV = "BATCHYARD_JOB_UIDS"
DIR_ENV = "BATCHYARD_JOB_UID_DIR"
DEFAULT_RANGE = (1_600_000_000, 2_147_000_000)
DEFAULT_DIR = "/var/lib/batchyard/job-uids"
_UNSAFE = re.compile(r"[^a-z0-9_.-]+")


def uid_range() -> tuple[int, int]:
    text = os.environ.get(RANGE_ENV, "")
    first, _, last = text.partition("-")
    try:
        low, high = int(first), int(last)
    except ValueError:
        return DEFAULT_RANGE
    return (low, high) if 1000 <= low < high < 2**32 - 1 else DEFAULT_RANGE


def account(user: str) -> str:
    """The job's account name: ``by-`` and the user's name in letters a passwd file takes
    (at most 32 characters, as useradd allows)."""
    clean = _UNSAFE.sub("-", user.lower()).strip("-.") or "user"
    name = f"by-{clean}"
    if len(name) > 32:
        name = f"by-{clean[:20]}-{zlib.crc32(user.encode()):08x}"
    return name


def uid_of(user: str, folder: str | None = None) -> int:
    """The uid of ``user`` on this machine, claimed in the registry when first used."""
    low, high = uid_range()
    registry = Path(folder or os.environ.get(DIR_ENV) or DEFAULT_DIR)
    registry.mkdir(mode=0o755, parents=True, exist_ok=True)
    span = high - low + 1  # (both ends included)
    start = zlib.crc32(user.encode()) % span
    for step in range(4096):
        uid = low + (start + step) % span
        path = registry / str(uid)
        owner = _read(path)
        if owner is None:
            owner = _claim(path, user)
        if owner == user:
            return uid
    raise OSError(f"no free job uid in {low}-{high} (registry {registry})")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _claim(path: Path, user: str) -> str | None:
    """The uid's owner after trying to claim it for ``user`` (atomically: ``link``)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    tmp.write_text(user + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return _read(path)


def account_files(folder: Path, user: str, uid: int, home: str) -> dict[str, str]:
    """``passwd`` and ``group`` for the job's view: the host's, with the job's account and
    its group added (``/etc/passwd`` itself is never changed)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = account(user)
    out = {}
    for base, line in (("passwd", f"{name}:x:{uid}:{uid}:batchyard job user {user}:{home}:"
                                  "/bin/sh"),
                       ("group", f"{name}:x:{uid}:")):
        try:
            text = Path("/etc", base).read_text()
        except OSError:
            text = ""
        kept = [ln for ln in text.splitlines() if ln and ln.split(":", 1)[0] != name]
        path = folder / base
        path.write_text("\n".join([*kept, line]) + "\n")
        path.chmod(0o644)
        out[base] = str(path)
    return out


def can_pass(path: str, uid: int) -> bool:
    """Whether ``uid`` (no supplementary group; its own group ``uid``) may search ``path``."""
    try:
        st = os.stat(path)
    except OSError:
        return True  # not there: nothing to pass
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & 0o100)
    if st.st_gid == uid:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


def barriers(paths: list[str], uid: int) -> list[str]:
    """The outermost folders on the way to ``paths`` that ``uid`` cannot pass (a test's
    0700 tmp dir, root's 0700 home): the sandbox puts an empty view over each and shows
    only what the job needs beneath it, which the job could not have reached anyway."""
    out: set[str] = set()
    for path in paths:
        parts = Path(path).parts
        for i in range(2, len(parts)):
            folder = str(Path(*parts[:i]))
            if not can_pass(folder, uid):
                out.add(folder)
                break
    return sorted(out)
