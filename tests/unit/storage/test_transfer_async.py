"""Stage-in on an async filesystem (the path Azure Blob and S3 take: every object a coroutine
on fsspec's loop), here fsspec's async wrapper around the local filesystem; the cache's
append-only index (and the older one-file-per-entry index it still reads); and when the
Blob filesystem may skip aiohttp's per-request environment look-ups."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

import strictkit
from batchyard.storage import transfer
from batchyard.storage.transfer import Cache, TransferError, download


def _async_fs() -> object:
    from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
    from fsspec.implementations.local import LocalFileSystem

    return AsyncFileSystemWrapper(LocalFileSystem(auto_mkdir=True))


def _tree(root: Path, count: int = 50) -> dict[str, bytes]:
    files = {f"d{i % 3}/f{i}.bin": os.urandom(100 + i) for i in range(count)}
    files["big.bin"] = os.urandom(transfer.SMALL + 12345)  # fetched to disk, not in memory
    files["empty"] = b""
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_async_download_cached_rerun_and_resume(tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = _tree(src)
    fs = _async_fs()
    total = sum(len(d) for d in files.values())
    cache = Cache(tmp_path / "cache")
    first = download(fs, str(src), tmp_path / "d1", store_id="s", cache=cache)
    assert first.files == len(files) and first.bytes_transferred == total
    for rel, data in files.items():
        assert (tmp_path / "d1" / rel).read_bytes() == data
    assert not list((tmp_path / "d1").rglob("*.part"))
    # a warm rerun (a fresh Cache object: the index is read back from disk) moves nothing
    again = download(fs, str(src), tmp_path / "d2", store_id="s", cache=Cache(tmp_path / "cache"))
    assert again.bytes_transferred == 0 and again.bytes_cached == total
    assert (tmp_path / "d2" / "big.bin").read_bytes() == files["big.bin"]
    # an interrupted copy is continued by range reads
    dest = tmp_path / "d3"
    (dest / "big.bin.part").parent.mkdir(parents=True)
    (dest / "big.bin.part").write_bytes(files["big.bin"][:5000])
    resumed = download(fs, str(src / "big.bin"), dest, store_id="s", cache=None)
    assert resumed.bytes_transferred == len(files["big.bin"]) - 5000
    assert (dest / "big.bin").read_bytes() == files["big.bin"]


def test_async_download_verifies_md5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    (src).mkdir()
    (src / "a.bin").write_bytes(b"the real content")
    monkeypatch.setattr(transfer, "remote_md5", lambda info: "0" * 32)
    with pytest.raises(TransferError, match="MD5"):
        download(_async_fs(), str(src), tmp_path / "d", store_id="s", cache=None)
    assert not (tmp_path / "d" / "a.bin").exists()


def test_async_download_names_a_missing_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        download(_async_fs(), str(tmp_path / "nope"), tmp_path / "d", store_id="s", cache=None)


def test_cache_index_is_one_log_and_old_entries_still_count(tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(b"x" * 10)
    sha = hashlib.sha256(b"x" * 10).hexdigest()
    cache = Cache(tmp_path / "cache")
    cache.store("id-new", blob, sha)
    cache.close()
    assert not list(cache.index_dir.iterdir())  # no file per entry
    lines = cache.log.read_text().split()
    assert len(lines) == 3 and lines[1] == sha
    assert Cache(tmp_path / "cache").lookup("id-new", 10) == cache.objects / sha
    # a line torn by a crash mid-append is skipped, and spoils no line after it
    with open(cache.log, "a") as fh:
        fh.write("\ndeadbeef 12")
    other = tmp_path / "other"
    other.write_bytes(b"y" * 5)
    later = Cache(tmp_path / "cache")
    later.store("id-later", other, hashlib.sha256(b"y" * 5).hexdigest())
    later.close()
    fresh = Cache(tmp_path / "cache")
    assert fresh.lookup("id-new", 10) == cache.objects / sha
    assert fresh.lookup("id-later", 5) is not None
    # the layout before: one JSON file per identity under index/
    legacy = cache.index_dir / hashlib.sha256(b"id-old").hexdigest()
    legacy.write_text(json.dumps({"sha256": sha,
                                  "mtime_ns": (cache.objects / sha).stat().st_mtime_ns}))
    assert Cache(tmp_path / "cache").lookup("id-old", 10) == cache.objects / sha
    # an object changed in place is not trusted
    os.utime(cache.objects / sha, ns=(1, 1))
    assert Cache(tmp_path / "cache").lookup("id-new", 10) is None


def test_blob_fs_skips_environment_lookups_only_when_they_find_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    strictkit.importorskip("adlfs")
    from batchyard.storage import blobfs

    for key in list(os.environ):
        if key.lower().endswith("_proxy"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert blobfs.environment_unused()
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert not blobfs.environment_unused()
    monkeypatch.delenv("HTTPS_PROXY")
    (tmp_path / "no-netrc").write_text("machine example.com login a password b\n")
    assert not blobfs.environment_unused()
