"""Verified, resumable, parallel copies between a store and a local directory, with a
content-addressed cache on the node.

Download: every object is fetched to ``<file>.part`` (a ``.part`` left by an interrupted run is
continued from where it stopped, by range read), checked for size and, where the store gives
one, MD5, then renamed into place. Its SHA-256 names it in the cache
(``objects/<sha256>``); an index maps (store, path, etag, size) to that hash, so a rerun of the
same data links the cached copy and transfers nothing.

Upload: files whose size and MD5 already match the remote object are skipped (a rerun or a
periodic sync sends only what changed); each upload is checked for size afterwards.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHUNK = 8 << 20
WORKERS = 16
Progress = Callable[[int], None]


class TransferError(Exception):
    """A copy that failed or did not verify; the message names the object and the cause."""


@dataclass
class Stats:
    files: int = 0
    bytes_transferred: int = 0
    bytes_cached: int = 0
    bytes_skipped: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for key, value in counts.items():
                setattr(self, key, getattr(self, key) + value)

    def as_dict(self) -> dict[str, int]:
        return {"files": self.files, "bytes_transferred": self.bytes_transferred,
                "bytes_cached": self.bytes_cached, "bytes_skipped": self.bytes_skipped}


def _etag(info: dict[str, Any]) -> str:
    tag = info.get("etag") or info.get("ETag") or ""
    return str(tag).strip('"')


def remote_md5(info: dict[str, Any]) -> str | None:
    """The MD5 hex digest a store records for an object, where it has one."""
    settings = info.get("content_settings")
    md5 = getattr(settings, "content_md5", None) if settings is not None else None
    if md5 is None and isinstance(settings, dict):
        md5 = settings.get("content_md5")
    if md5:
        return bytes(md5).hex()
    tag = _etag(info)
    if "ETag" in info and len(tag) == 32 and "-" not in tag:
        return tag  # an S3 single-part upload's ETag is its MD5
    return None


def file_digests(path: Path) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


class Cache:
    """Content-addressed objects plus an index from remote identity to content hash."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"
        self.index_dir = root / "index"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.index_dir.mkdir(parents=True, exist_ok=True)

    def _entry(self, identity: str) -> Path:
        return self.index_dir / hashlib.sha256(identity.encode()).hexdigest()

    def lookup(self, identity: str, size: int) -> Path | None:
        try:
            entry = json.loads(self._entry(identity).read_text())
            obj = self.objects / entry["sha256"]
            st = obj.stat()
        except (OSError, ValueError, KeyError):
            return None
        if st.st_size != size or st.st_mtime_ns != entry.get("mtime_ns"):
            return None  # changed in place: not trusted
        return obj

    def store(self, identity: str, path: Path, sha256: str) -> None:
        obj = self.objects / sha256
        if not obj.exists():
            tmp = obj.with_name(f".{sha256}.{os.getpid()}.{threading.get_ident()}")
            _link_or_copy(path, tmp)
            os.replace(tmp, obj)
        entry = {"sha256": sha256, "mtime_ns": obj.stat().st_mtime_ns}
        tmp_entry = self._entry(identity).with_suffix(f".{threading.get_ident()}.tmp")
        tmp_entry.write_text(json.dumps(entry))
        os.replace(tmp_entry, self._entry(identity))


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        import shutil

        shutil.copyfile(src, dst)


def listing(fs: Any, root: str) -> dict[str, dict[str, Any]]:
    """Objects under ``root`` by path relative to it (a single object: its own name)."""
    if fs.isfile(root):
        return {root.rstrip("/").rsplit("/", 1)[-1]: fs.info(root)}
    if not fs.exists(root):
        raise FileNotFoundError(root)
    found = fs.find(root, detail=True)
    base = root.rstrip("/") + "/"
    out: dict[str, dict[str, Any]] = {}
    for path, info in found.items():
        if info.get("type") == "directory":
            continue
        rel = path[len(base):] if path.startswith(base) else path.rsplit("/", 1)[-1]
        if rel and not rel.endswith("/"):
            out[rel] = info
    return out


def download(fs: Any, root: str, dest: Path, *, store_id: str, cache: Cache | None,
             progress: Progress | None = None) -> Stats:
    """Everything under ``root`` into ``dest`` (verified; resumable; cached)."""
    stats = Stats()
    objects = listing(fs, root)
    dest.mkdir(parents=True, exist_ok=True)

    def one(rel: str, info: dict[str, Any]) -> None:
        size = int(info.get("size") or 0)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        identity = f"{store_id}|{info['name']}|{_etag(info)}|{size}"
        cached = cache.lookup(identity, size) if cache else None
        if cached is not None:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            _link_or_copy(cached, target)
            stats.add(files=1, bytes_cached=size)
            if progress:
                progress(size)
            return
        part = target.with_name(target.name + ".part")
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        if have == 0:
            fs.get_file(info["name"], str(part))
        elif have < size:
            with open(part, "ab") as fh:
                offset = have
                while offset < size:
                    end = min(size, offset + CHUNK)
                    fh.write(fs.cat_file(info["name"], start=offset, end=end))
                    offset = end
        got = part.stat().st_size
        if got != size:
            raise TransferError(f"{info['name']}: got {got} bytes, the store has {size}")
        sha, md5 = file_digests(part)
        expected = remote_md5(info)
        if expected and expected != md5:
            part.unlink()
            raise TransferError(f"{info['name']}: MD5 {md5} does not match the store's "
                                f"{expected}")
        os.replace(part, target)
        if cache:
            cache.store(identity, target, sha)
        stats.add(files=1, bytes_transferred=size - have)
        if progress:
            progress(size)

    _parallel(one, list(objects.items()))
    return stats


def upload(fs: Any, src: Path, root: str, *, progress: Progress | None = None,
           seen: dict[str, tuple[int, int]] | None = None) -> Stats:
    """Every file under ``src`` to ``root`` (a single file: to ``root/<name>``). Files already
    there with the same size (and MD5 where the store has one) are skipped; ``seen`` remembers
    (size, mtime) of what this process already sent, for periodic syncs."""
    stats = Stats()
    if src.is_file():
        files = [(src.name, src)]
    else:
        files = [(p.relative_to(src).as_posix(), p) for p in sorted(src.rglob("*"))
                 if p.is_file() and not p.is_symlink() and not p.name.endswith(".part")]
    try:
        remote = listing(fs, root) if files else {}
    except FileNotFoundError:
        remote = {}

    def one(rel: str, path: Path) -> None:
        st = path.stat()
        key = (st.st_size, st.st_mtime_ns)
        if seen is not None and seen.get(rel) == key:
            stats.add(bytes_skipped=st.st_size)
            return
        target = f"{root.rstrip('/')}/{rel}" if root.rstrip("/") else rel
        have = remote.get(rel)
        if have is not None and int(have.get("size") or 0) == st.st_size:
            md5 = remote_md5(have)
            if md5 is None or md5 == file_digests(path)[1]:
                stats.add(files=1, bytes_skipped=st.st_size)
                if seen is not None:
                    seen[rel] = key
                return
        fs.put_file(str(path), target)
        info = fs.info(target)
        if int(info.get("size") or 0) != st.st_size:
            raise TransferError(f"{target}: uploaded {st.st_size} bytes, the store has "
                                f"{info.get('size')}")
        stats.add(files=1, bytes_transferred=st.st_size)
        if seen is not None:
            seen[rel] = key
        if progress:
            progress(st.st_size)

    _parallel(one, files)
    return stats


def _parallel(fn: Callable[[str, Any], None], items: list[tuple[str, Any]]) -> None:
    if len(items) <= 1:
        for rel, item in items:
            fn(rel, item)
        return
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(items))) as pool:
        futures = [pool.submit(fn, rel, item) for rel, item in items]
        errors = [f.exception() for f in futures]
    failed = [e for e in errors if e is not None]
    if failed:
        raise failed[0]
