"""Verified, resumable, cached transfers between local directories (the same code path as
Azure Blob and S3, through fsspec's local filesystem)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batchyard.storage.stage import describe
from batchyard.storage.stores import make_store, open_fs, remote_path, url_of
from batchyard.storage.transfer import Cache, download, upload


def _tree(root: Path) -> dict[str, bytes]:
    files = {"a.bin": os.urandom(10000), "sub/b.txt": b"hello", "sub/deep/c": b""}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_download_then_cached_rerun(tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = _tree(src)
    store = make_store("local", str(src), label="t")
    fs = open_fs(store)
    cache = Cache(tmp_path / "cache")
    first = download(fs, remote_path(store), tmp_path / "d1", store_id="s", cache=cache)
    assert first.files == 3 and first.bytes_transferred == 10005
    for rel, data in files.items():
        assert (tmp_path / "d1" / rel).read_bytes() == data
    again = download(fs, remote_path(store), tmp_path / "d2", store_id="s", cache=cache)
    assert again.bytes_transferred == 0 and again.bytes_cached == 10005
    assert (tmp_path / "d2" / "a.bin").read_bytes() == files["a.bin"]


def test_resume_continues_a_partial_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = _tree(src)
    dest = tmp_path / "d"
    (dest / "a.bin.part").parent.mkdir(parents=True)
    (dest / "a.bin.part").write_bytes(files["a.bin"][:4000])
    store = make_store("local", str(src), label="t")
    stats = download(open_fs(store), remote_path(store), dest, store_id="s", cache=None)
    assert stats.bytes_transferred == 10005 - 4000
    assert (dest / "a.bin").read_bytes() == files["a.bin"]
    assert not (dest / "a.bin.part").exists()


def test_upload_skips_unchanged(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src)
    store = make_store("local", str(tmp_path / "remote"), label="t")
    fs = open_fs(store)
    seen: dict[str, tuple[int, int]] = {}
    first = upload(fs, src, remote_path(store), seen=seen)
    assert first.bytes_transferred == 10005
    second = upload(fs, src, remote_path(store), seen=seen)
    assert second.bytes_transferred == 0
    (src / "sub" / "b.txt").write_bytes(b"changed!")
    third = upload(fs, src, remote_path(store), seen=seen)
    assert third.bytes_transferred == 8
    assert (tmp_path / "remote" / "sub" / "b.txt").read_bytes() == b"changed!"


def test_missing_path_is_named(tmp_path: Path) -> None:
    store = make_store("local", str(tmp_path / "nope"), label="t")
    with pytest.raises(FileNotFoundError) as info:
        download(open_fs(store), remote_path(store), tmp_path / "d", store_id="s", cache=None)
    assert describe(info.value).startswith("not found")


def test_urls_carry_no_credentials() -> None:
    store = make_store("azure_blob", "cont/x", label="t", account_name="acct",
                       credentials={"account_key": "SECRETKEY"})
    assert url_of(store) == "https://acct.blob.core.windows.net/cont/x"
    assert "SECRETKEY" not in url_of(store)
    s3 = make_store("s3", "bucket/p", label="t", credentials={"secret_access_key": "S"})
    assert url_of(s3, "sub") == "s3://bucket/p/sub"

