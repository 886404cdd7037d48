"""One unprivileged uid per submitting user (node/jobuser.py): stable, unique on a machine
even when two names hash to the same uid, never a real account's; an account line for the
job's view; and the folders on the way that a uid cannot pass."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from batchyard.node import jobuser


def test_a_user_keeps_its_uid_and_two_users_never_share_one(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv(jobuser.RANGE_ENV, "2000000-2000003")  # four uids: collisions
    registry = str(tmp_path / "uids")
    names = ["alice", "bob", "carol", "dave"]
    got: dict[str, list[int]] = {n: [] for n in names}

    def claim(name: str) -> None:
        got[name].append(jobuser.uid_of(name, registry))

    threads = [threading.Thread(target=claim, args=(n,)) for n in names * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    uids = {n: set(v) for n, v in got.items()}
    assert all(len(v) == 1 for v in uids.values()), uids  # stable
    assert len({next(iter(v)) for v in uids.values()}) == 4  # unique
    assert all(2000000 <= next(iter(v)) <= 2000003 for v in uids.values())
    with pytest.raises(OSError, match="no free job uid"):
        jobuser.uid_of("eve", registry)


def test_default_range_is_far_above_real_accounts(tmp_path: Path) -> None:
    uid = jobuser.uid_of("alice", str(tmp_path))
    assert 1_600_000_000 <= uid < 2**31
    assert uid == jobuser.uid_of("alice", str(tmp_path))


@pytest.mark.parametrize(("user", "name"), [
    ("alice", "by-alice"), ("Alice.Smith@corp", "by-alice.smith-corp"), ("", "by-user")])
def test_account_names(user: str, name: str) -> None:
    assert jobuser.account(user) == name
    assert len(jobuser.account("x" * 100)) <= 32


def test_account_files_add_the_job_account(tmp_path: Path) -> None:
    files = jobuser.account_files(tmp_path, "alice", 1_700_000_001, "/h")
    passwd = Path(files["passwd"]).read_text().splitlines()
    assert passwd[-1] == "by-alice:x:1700000001:1700000001:batchyard job user alice:/h:/bin/sh"
    assert any(line.startswith("root:") for line in passwd)
    assert Path(files["group"]).read_text().splitlines()[-1] == "by-alice:x:1700000001:"


def test_barriers_are_the_outermost_folders_a_uid_cannot_pass(tmp_path: Path) -> None:
    top = tmp_path / "open"
    closed = top / "closed"
    inner = closed / "inner"
    inner.mkdir(parents=True)
    os.chmod(top, 0o755)
    os.chmod(closed, 0o700)
    os.chmod(inner, 0o755)
    uid = 1_700_000_002
    assert jobuser.barriers([str(inner / "x"), str(top / "y")], uid) == [str(closed)]
    os.chown(closed, uid, uid)
    assert jobuser.barriers([str(inner / "x")], uid) == []
    assert jobuser.barriers([str(inner / "x")], 0) == []
