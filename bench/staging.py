"""Stage-in through batchyard's storage layer vs a plain fsspec copy of the same data, in one
run, against a real Azurite (Azure Blob emulator) on loopback.

Two datasets: 1,000 x 4 KiB files and one 1 GiB file. For each, a plain fsspec copy (adlfs's
``AzureBlobFileSystem`` as a user would open it, ``fs.get(recursive=True)``: fsspec's own
concurrent batch) and batchyard's stage-in (``storage.transfer.download`` through
``stores.open_fs``: what the node's stage process runs — concurrent, size/MD5-verified,
resumable, filling the node's content-addressed cache) alternate ``--runs`` times; the ratio
is plain time / batchyard time (target >= 1.0), with the client's CPU time beside it (the
client is what a small-file copy is bound by). Then a rerun with the warm cache must transfer
0 bytes.

    python bench/staging.py [--runs 3] [--small-files 1000] [--big-mib 1024]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from batchyard.storage.stores import make_store, open_fs, remote_path  # noqa: E402
from batchyard.storage.transfer import Cache, download  # noqa: E402
from storagekit import azurite  # noqa: E402


def _populate(fs: Any, small: int, big_mib: int, scratch: Path) -> None:
    fs.mkdir("bench")
    src = scratch / "src-small"
    src.mkdir()
    for i in range(small):
        (src / f"f{i:05d}.bin").write_bytes(os.urandom(4096))
    fs.put(str(src) + "/", "bench/small/", recursive=True)
    big = scratch / "big.bin"
    with open(big, "wb") as fh:
        block = os.urandom(1 << 20)
        for _ in range(big_mib):
            fh.write(block)
    fs.put_file(str(big), "bench/big/big.bin")
    big.unlink()
    shutil.rmtree(src)


def _plain(fs: Any, root: str, dest: Path) -> tuple[float, float]:
    cpu, started = time.process_time(), time.perf_counter()
    fs.get(root.rstrip("/") + "/", str(dest) + "/", recursive=True)
    return time.perf_counter() - started, time.process_time() - cpu


def _staged(fs: Any, root: str, dest: Path, cache: Cache
            ) -> tuple[float, float, dict[str, int]]:
    cpu, started = time.process_time(), time.perf_counter()
    stats = download(fs, root, dest, store_id="bench", cache=cache)
    return time.perf_counter() - started, time.process_time() - cpu, stats.as_dict()


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--small-files", type=int, default=1000)
    parser.add_argument("--big-mib", type=int, default=1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-staging-") as tmp:
        scratch = Path(tmp)
        with azurite(scratch / "azurite") as az:
            store = make_store("azure_blob", "bench", label="bench", account_name=az.account,
                               endpoint=az.endpoint, credentials={"account_key": az.key})
            fs = open_fs(store)  # batchyard's
            from adlfs import AzureBlobFileSystem

            plain_fs = AzureBlobFileSystem(connection_string=az.connection_string,
                                           skip_instance_cache=True)
            print(f"populating Azurite: {args.small_files} x 4 KiB, 1 x {args.big_mib} MiB")
            _populate(fs, args.small_files, args.big_mib, scratch)
            ok = True
            for name in ("small", "big"):
                root = remote_path(store, name)
                plain_times, staged_times, plain_cpu, staged_cpu = [], [], [], []
                for run in range(args.runs):
                    for kind in (("plain", "staged") if run % 2 == 0 else ("staged", "plain")):
                        dest = scratch / f"{name}-{kind}-{run}"
                        if kind == "plain":
                            took, cpu = _plain(plain_fs, root, dest)
                            plain_times.append(took)
                            plain_cpu.append(cpu)
                        else:
                            cache = Cache(scratch / f"cache-{name}-{run}")
                            took, cpu, stats = _staged(fs, root, dest, cache)
                            staged_times.append(took)
                            staged_cpu.append(cpu)
                            assert stats["bytes_cached"] == 0
                        assert _size(dest) > 0
                        shutil.rmtree(dest)
                plain, staged = statistics.median(plain_times), statistics.median(staged_times)
                ratio = plain / staged
                warm_cache = Cache(scratch / f"cache-{name}-0")
                took, _, stats = _staged(fs, root, scratch / f"{name}-warm", warm_cache)
                print(f"{name:5s}: plain fsspec {plain:7.2f}s (cpu "
                      f"{statistics.median(plain_cpu):.2f}s)  batchyard stage-in {staged:7.2f}s "
                      f"(cpu {statistics.median(staged_cpu):.2f}s)  ratio {ratio:.2f}  | warm "
                      f"rerun {took:.2f}s: {stats['bytes_transferred']} B transferred, "
                      f"{stats['bytes_cached']} B from cache")
                ok = ok and ratio >= 1.0 and stats["bytes_transferred"] == 0
                shutil.rmtree(scratch / f"{name}-warm")
                for cache_dir in scratch.glob(f"cache-{name}-*"):
                    shutil.rmtree(cache_dir)
    print("PASS" if ok else "FAIL: ratio < 1.0 or the warm rerun transferred bytes")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
