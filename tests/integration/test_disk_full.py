"""The server's disk fills up (issue 16, item 6): writes are answered 503 naming the cause (never
a 500), reads go on, the server stays up, nothing stored before is lost, and it takes writes
again once space returns. The home is a small tmpfs of its own (mounted as root)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import strictkit
from yardkit import Yard, pid_alive

pytestmark = strictkit.requires(os.geteuid() != 0, "mounting a tmpfs needs root")

JOBS = "/workspaces/default/jobs"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m,mode=0700", "tmpfs", str(mount)],
                   check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path) -> None:
    """Write until the file system says no space is left."""
    block = b"\0" * (1 << 20)
    with open(path, "wb") as fh:
        try:
            while True:
                fh.write(block)
                fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    with contextlib.suppress(OSError), open(path, "ab") as fh:  # the last partial blocks
        while True:
            fh.write(b"\0" * 4096)
            fh.flush()


def _body(name: str) -> dict[str, object]:
    return {"spec": {"command": "true", "distribution": {"type": "custom"}}, "name": name,
            "cluster": "df"}


def test_a_full_disk_is_a_503_and_the_server_recovers(small_disk: Path, tmp_path: Path) -> None:
    yard = Yard(small_disk / "home", tmp_path / "work")
    (tmp_path / "work").mkdir()
    try:
        yard.start_server()
        yard.ok("cluster", "create", "-n", "df", "-s", "Standard_D2_v2", "-t", "1")
        assert yard.http.post(JOBS, json=_body("before")).status_code == 201
        filler = small_disk / "filler"
        _fill(filler)
        answers = []
        made = []
        for i in range(300):  # until the database has to grow and cannot
            resp = yard.http.post(JOBS, json=_body(f"full-{i}"))
            answers.append(resp.status_code)
            assert resp.status_code < 500 or resp.status_code == 503, resp.text
            if resp.status_code == 201:
                made.append(f"full-{i}")
            if resp.status_code == 503:
                error = resp.json()["error"]
                assert error["code"] == "storage_unavailable"
                assert "disk is full" in error["message"], error
                assert resp.headers.get("Retry-After")
                break
        assert 503 in answers, answers
        assert pid_alive(yard.server_pid), "the server died"
        assert yard.http.get("/health").status_code == 200  # reads go on
        names = {j["name"] for j in yard.http.get(JOBS).json()}
        assert {"before", *made} <= names  # nothing stored before is lost
        filler.unlink()
        after = yard.http.post(JOBS, json=_body("after"))
        assert after.status_code == 201, after.text
        assert yard.wait_job("after", timeout=120)["state"] == "succeeded"
    finally:
        with contextlib.suppress(OSError):  # the disk goes with the test: keep the log
            (tmp_path / "server.log").write_bytes((yard.home / "server.log").read_bytes())
        yard.stop()
