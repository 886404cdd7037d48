"""NFS mounts on the node (Batch AI ``fileServers`` given as ``host:/export``, native
``mounts: [{kind: file_server}]``), with the kernel's NFS client (``mount -t nfs``, from
``nfs-common``; standard library only, like the launcher). Never skipped silently: a node
that cannot mount says why, and the job fails in preparing with the mount named."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from pathlib import Path

NFS_PORT = 2049
TYPES = ("nfs", "nfs4")


def unavailable() -> str | None:
    """None when this node can make an NFS mount, else why not."""
    if os.geteuid() != 0:
        return "NFS mounts need the node launcher to run as root"
    if not (shutil.which("mount.nfs") or os.path.exists("/sbin/mount.nfs")
            or os.path.exists("/usr/sbin/mount.nfs")):
        return "mount.nfs is not installed on this node (Debian: nfs-common)"
    try:
        with open("/proc/filesystems") as fh:
            known = {line.split()[-1] for line in fh if line.strip()}
    except OSError:
        known = set()
    if not known & set(TYPES) and not _loadable():
        return "this node's kernel has no NFS client (no nfs in /proc/filesystems)"
    return None


def _loadable() -> bool:
    release = os.uname().release
    return any(Path(f"/lib/modules/{release}/kernel/fs/nfs").glob("nfs*.ko*"))


def split_source(source: str) -> tuple[str, str]:
    """``host:/export`` -> (host, /export); ValueError for anything else."""
    cut = source.find(":/")
    host, export = source[:cut].strip("[]"), source[cut + 1:]
    if cut <= 0 or not host:
        raise ValueError(f"{source!r} is not host:/export")
    return host, export


def mount_argv(source: str, target: Path, options: str | None) -> list[str]:
    opts = [o.strip() for o in (options or "").split(",") if o.strip()]
    if not any(o.startswith(("vers=", "nfsvers=")) for o in opts):
        opts.insert(0, "vers=4")
    return ["mount", "-t", "nfs", "-o", ",".join(opts), source, str(target)]


def mount(label: str, source: str, target: Path, options: str | None,
          timeout: float = 60.0) -> None:
    """Mount ``source`` at ``target``; RuntimeError naming the mount and the cause."""
    try:
        host, _export = split_source(source)
    except ValueError as exc:
        raise RuntimeError(f"{label}: {exc}") from None
    why = unavailable()
    if why:
        raise RuntimeError(f"{label}: cannot mount NFS {source}: {why}")
    try:
        with socket.create_connection((host, NFS_PORT), timeout=5.0):
            pass
    except OSError as exc:
        raise RuntimeError(f"{label}: NFS server {host}:{NFS_PORT} unreachable "
                           f"({exc.strerror or exc})") from None
    target.mkdir(parents=True, exist_ok=True)
    target = Path(os.path.realpath(target))
    try:
        out = subprocess.run(mount_argv(source, target, options), capture_output=True,
                             text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{label}: mounting NFS {source} did not finish in "
                           f"{timeout:g}s") from None
    if out.returncode != 0:
        detail = " ".join((out.stderr or out.stdout).strip().splitlines()[-2:])
        raise RuntimeError(f"{label}: mount -t nfs {source} failed: {detail}")


def unmount(target: Path) -> None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        if subprocess.run(["umount", str(target)], capture_output=True,
                          timeout=60).returncode:
            subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=60)


def sweep(tag: str, mounts_file: str = "/proc/self/mounts") -> int:
    """Lazily unmount the NFS mounts a dead launcher of ``tag`` left (its mount points lie
    under the attempt's job directory, ``jobs/<job>-<uuid[:8]>/``)."""
    marker = f"-{tag.split('/', 1)[0][:8]}/"
    found = []
    with contextlib.suppress(OSError), open(mounts_file) as fh:
        for line in fh:
            parts = line.split()
            if len(parts) > 2 and parts[2] in TYPES and marker in parts[1]:
                found.append(parts[1].replace("\\040", " "))
    for target in found:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["umount", "-l", target], capture_output=True, timeout=60)
    return len(found)
