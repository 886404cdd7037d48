"""Verified, resumable, parallel copies between a store and a local directory, with a
content-addressed cache on the node.

Download: every object is fetched to ``<file>.part`` (a ``.part`` left by an interrupted run is
continued from where it stopped, by range read), checked for size and, where the store gives
one, MD5, then renamed into place. Its SHA-256 names it in the cache
(``objects/<sha256>``); an index maps (store, path, etag, size) to that hash, so a rerun of the
same data links the cached copy and transfers nothing. On an async store (Azure Blob through
adlfs, S3 through s3fs) every object is one coroutine on fsspec's event loop, up to
``ASYNC_BATCH`` in flight, as fsspec's own batched ``get`` does (no thread per transfer);
small objects are read into memory and hashed there, written once.

Upload: files whose size and MD5 already match the remote object are skipped (a rerun or a
periodic sync sends only what changed); each upload is checked for size afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHUNK = 8 << 20
WORKERS = 16
ASYNC_BATCH = 128  # objects in flight at once on an async store (fsspec's batch_size)
SMALL = 1 << 20  # objects up to this size are fetched into memory (at most ASYNC_BATCH MiB)
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


def file_digests(path: Path, *, md5: bool = True) -> tuple[str, str]:
    """SHA-256 and MD5 hex digests of ``path`` (MD5 "" with ``md5=False``: it costs more than
    the SHA-256 and is only needed where the store has one to check against)."""
    sha = hashlib.sha256()
    m5 = hashlib.md5(usedforsecurity=False) if md5 else None
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            sha.update(chunk)
            if m5 is not None:
                m5.update(chunk)
    return sha.hexdigest(), m5.hexdigest() if m5 is not None else ""


class Cache:
    """Content-addressed objects plus an index from remote identity to content hash.

    The index is one append-only log, ``index.log``: a line ``<sha256 of identity> <sha256 of
    content> <mtime_ns>`` per stored object, the last line of an identity winning, read once
    per ``Cache``. Appending a line costs no file creation (a file per entry did, once per
    object: more than a small object's own download on some disks); appends from concurrent
    stage processes are single ``O_APPEND`` writes, each starting with its own newline, so a
    line torn by a crash spoils only itself and is skipped (a cache miss, never a wrong hit:
    the object's size and mtime are checked too). Entries of the older layout (a JSON file
    per identity under ``index/``) are still found."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"
        self.index_dir = root / "index"
        self.log = root / "index.log"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.index_dir.mkdir(parents=True, exist_ok=True)
        with os.scandir(self.index_dir) as entries:
            self._has_legacy = next(entries, None) is not None
        self._entries: dict[str, tuple[str, int]] | None = None
        self._fd: int | None = None
        self._lock = threading.Lock()

    @staticmethod
    def _key(identity: str) -> str:
        return hashlib.sha256(identity.encode()).hexdigest()

    def _index(self) -> dict[str, tuple[str, int]]:
        with self._lock:
            if self._entries is None:
                self._entries = self._read_log()
            return self._entries

    def _read_log(self) -> dict[str, tuple[str, int]]:
        entries: dict[str, tuple[str, int]] = {}
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return entries
        lines = [line for line in text.split("\n") if line]
        for line in lines:
            parts = line.split(" ")
            if (len(parts) == 3 and len(parts[0]) == 64 and len(parts[1]) == 64
                    and parts[2].isdigit()):
                entries[parts[0]] = (parts[1], int(parts[2]))
        if len(lines) > 2 * len(entries) + 10000:  # mostly superseded lines: compact
            tmp = self.log.with_name(f".index.log.{os.getpid()}.{threading.get_ident()}")
            tmp.write_text("".join(f"\n{k} {sha} {mtime}" for k, (sha, mtime) in entries.items()))
            os.replace(tmp, self.log)
        return entries

    def _legacy(self, key: str) -> tuple[str, int] | None:
        if not self._has_legacy:
            return None
        try:
            entry = json.loads((self.index_dir / key).read_text())
            return str(entry["sha256"]), int(entry["mtime_ns"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def lookup(self, identity: str, size: int) -> Path | None:
        key = self._key(identity)
        entry = self._index().get(key) or self._legacy(key)
        if entry is None:
            return None
        obj = self.objects / entry[0]
        try:
            st = obj.stat()
        except OSError:
            return None
        if st.st_size != size or st.st_mtime_ns != entry[1]:
            return None  # changed in place: not trusted
        return obj

    def store(self, identity: str, path: Path, sha256: str, mtime_ns: int | None = None
              ) -> None:
        """Keep ``path`` (whose SHA-256 is ``sha256``; ``mtime_ns``: its mtime, when the
        caller knows it) as the cached copy of ``identity``."""
        obj = self.objects / sha256
        try:
            os.link(path, obj)  # atomic; an object already there has the same content
            linked = True
        except FileExistsError:
            linked = False
        except OSError:
            tmp = obj.with_name(f".{sha256}.{os.getpid()}.{threading.get_ident()}")
            _link_or_copy(path, tmp)
            os.replace(tmp, obj)
            linked = False
        mtime = mtime_ns if linked and mtime_ns is not None else obj.stat().st_mtime_ns
        key = self._key(identity)
        line = f"\n{key} {sha256} {mtime}".encode()
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, line)
            if self._entries is not None:
                self._entries[key] = (sha256, mtime)

    def close(self) -> None:
        """Close the index log (it reopens on the next ``store``)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


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


@dataclass
class _Fetch:
    """One object to fetch into ``part`` (``have`` bytes of it already there)."""

    name: str
    size: int
    target: Path
    part: Path
    have: int
    identity: str
    expected_md5: str | None


def download(fs: Any, root: str, dest: Path, *, store_id: str, cache: Cache | None,
             progress: Progress | None = None) -> Stats:
    """Everything under ``root`` into ``dest`` (verified; resumable; cached)."""
    stats = Stats()
    objects = listing(fs, root)
    dest.mkdir(parents=True, exist_ok=True)
    parts: dict[Path, dict[str, int]] = {}  # per directory: the .part files already there
    fetches: list[tuple[str, _Fetch]] = []
    for rel, info in objects.items():
        size = int(info.get("size") or 0)
        target = dest / rel
        in_dir = parts.get(target.parent)
        if in_dir is None:
            in_dir = parts[target.parent] = _part_files(target.parent)
        identity = f"{store_id}|{info['name']}|{_etag(info)}|{size}"
        cached = cache.lookup(identity, size) if cache else None
        if cached is not None:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            _link_or_copy(cached, target)
            stats.add(files=1, bytes_cached=size)
            if progress:
                progress(size)
            continue
        part = target.with_name(target.name + ".part")
        have = in_dir.get(part.name, 0)
        if have > size:
            part.unlink()
            have = 0
        fetches.append((rel, _Fetch(info["name"], size, target, part, have, identity,
                                    remote_md5(info))))

    def finish(f: _Fetch, digests: tuple[str, str] | None = None,
               written: tuple[int, int] | None = None) -> None:
        """Verify, rename into place, cache. ``written``: (size, mtime_ns) of the part as
        just written, when the caller has them (saves a stat)."""
        if written is None:
            st = f.part.stat()
            written = st.st_size, st.st_mtime_ns
        got, mtime = written
        if got != f.size:
            raise TransferError(f"{f.name}: got {got} bytes, the store has {f.size}")
        sha, md5 = digests or file_digests(f.part, md5=f.expected_md5 is not None)
        if f.expected_md5 and f.expected_md5 != md5:
            f.part.unlink()
            raise TransferError(f"{f.name}: MD5 {md5} does not match the store's "
                                f"{f.expected_md5}")
        os.replace(f.part, f.target)
        if cache:
            cache.store(f.identity, f.target, sha, mtime)
        stats.add(files=1, bytes_transferred=f.size - f.have)
        if progress:
            progress(f.size)

    try:
        if getattr(fs, "async_impl", False) and getattr(fs, "loop", None) is not None:
            _fetch_async(fs, fetches, finish)
            return stats

        def one(rel: str, f: _Fetch) -> None:
            if f.have == 0:
                fs.get_file(f.name, str(f.part))
            elif f.have < f.size:
                with open(f.part, "ab") as fh:
                    offset = f.have
                    while offset < f.size:
                        end = min(f.size, offset + CHUNK)
                        fh.write(fs.cat_file(f.name, start=offset, end=end))
                        offset = end
            finish(f)

        _parallel(one, fetches)
        return stats
    finally:
        if cache:
            cache.close()


def _part_files(directory: Path) -> dict[str, int]:
    """Sizes of the ``.part`` files in ``directory`` (made if missing: then there are none).
    One directory scan instead of a stat per object."""
    found: dict[str, int] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.endswith(".part") and entry.is_file(follow_symlinks=False):
                    found[entry.name] = entry.stat(follow_symlinks=False).st_size
    except FileNotFoundError:
        directory.mkdir(parents=True, exist_ok=True)
    return found


def _fetch_async(fs: Any, fetches: list[tuple[str, _Fetch]], finish: Callable[..., None]
                 ) -> None:
    """The fetches as coroutines on ``fs``'s event loop, ``ASYNC_BATCH`` at a time; every one
    is tried, then the first failure is raised (as ``_parallel`` does)."""
    from fsspec.asyn import sync

    async def one(f: _Fetch, gate: asyncio.Semaphore) -> None:
        async with gate:
            if f.have == 0 and f.size <= SMALL:
                data = await fs._cat_file(f.name)
                with open(f.part, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    mtime = os.fstat(fh.fileno()).st_mtime_ns
                digests = (hashlib.sha256(data).hexdigest(),
                           hashlib.md5(data, usedforsecurity=False).hexdigest())
                finish(f, digests, (len(data), mtime))
                return
            if f.have == 0:
                await fs._get_file(f.name, str(f.part))
            elif f.have < f.size:
                with open(f.part, "ab") as fh:
                    offset = f.have
                    while offset < f.size:
                        end = min(f.size, offset + CHUNK)
                        fh.write(await fs._cat_file(f.name, start=offset, end=end))
                        offset = end
        await asyncio.to_thread(finish, f, None)  # hashing it on the loop would stall the rest

    async def run_all() -> list[BaseException | None]:
        gate = asyncio.Semaphore(ASYNC_BATCH)
        coros: list[Coroutine[Any, Any, None]] = [one(f, gate) for _, f in fetches]
        return await asyncio.gather(*coros, return_exceptions=True)

    if not fetches:
        return
    failed = [e for e in sync(fs.loop, run_all) if e is not None]
    if failed:
        raise failed[0]


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
