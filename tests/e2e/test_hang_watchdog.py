"""The hang watchdog and `job stacks` on a real 2x2 gang (issue 15): rank 3 deadlocks on a
lock before a barrier that ranks 0-2 wait in (a real TCP barrier at MASTER_ADDR:MASTER_PORT,
served by rank 0), so nothing on any node writes a line after start-up. After
``hang_timeout`` the watchdog dumps every rank with py-spy, keeps the dump with the attempt
and records ``hung`` in the job's events naming where the ranks are; `job stacks` dumps on
demand and shows rank 3 apart from ranks 0-2; ``on_hang: fail`` ends the job failed, naming
the hang."""

from __future__ import annotations

import json
from typing import Any

import pytest

from yardkit import Yard, wait_until

HANG_TIMEOUT = 5
HANG = """\
import os
import socket
import threading
import time

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ADDR, PORT = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


def serve():
    server = socket.create_server(("", PORT), reuse_port=True)
    peers = [server.accept()[0] for _ in range(WORLD)]
    for peer in peers:
        peer.sendall(b"go")


def barrier():
    while True:
        try:
            sock = socket.create_connection((ADDR, PORT), timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    sock.settimeout(None)
    sock.sendall(b"%d" % RANK)
    return sock.recv(2)


def take_twice():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


def main():
    if RANK == 0:
        threading.Thread(target=serve, daemon=True).start()
    print(f"rank {RANK} started", flush=True)
    if RANK == 3:
        take_twice()
    barrier()
    print(f"rank {RANK} passed the barrier", flush=True)


main()
"""
pytestmark = pytest.mark.slow


def submit(yard: Yard, cluster: str, name: str, on_hang: str) -> None:
    path = yard.write_job(name, {
        "nodes": 2, "distribution": {"type": "pytorch", "processes_per_node": 2},
        "command": "python hang.py", "code": str(yard.work / "jobs" / name),
        "limits": {"hang_timeout": HANG_TIMEOUT, "on_hang": on_hang, "grace_period": 1,
                   "max_wall_clock": 300}}, files={"hang.py": HANG})
    yard.ok("job", "create", "-f", str(path), "-n", name, "-c", cluster)


def hung_event(yard: Yard, name: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        return next((e for e in yard.job(name)["events"] if e["to"] == "hung"), None)

    event: dict[str, Any] = wait_until(found, 120, 0.25, f"job {name} to be marked hung")
    return event


def test_watchdog_dumps_a_deadlocked_gang_and_job_stacks_shows_rank_3(yard: Yard,
                                                                     cluster2: str) -> None:
    submit(yard, cluster2, "hangdump", "dump")
    event = hung_event(yard, "hangdump")
    job = yard.job("hangdump")
    assert job["state"] == "running"  # on_hang: dump keeps it running
    assert event["ts"] - job["started_at"] >= HANG_TIMEOUT - 0.5, (event, job)
    message = event["message"]
    assert f"no rank progressed for {HANG_TIMEOUT}s" in message, message
    assert "rank 3 in take_twice (hang.py:" in message, message
    assert "ranks 0-2 in barrier (hang.py:" in message, message

    # the dump is kept with the attempt, on the server's disk, every node's answer
    kept = yard.js("job", "stacks", "hangdump", "--list")
    assert [k["reason"] for k in kept] == ["hang"] and kept[0]["complete"], kept
    ident = kept[0]["id"]
    folder = yard.attempt_dir(job) / "stacks" / ident
    assert sorted(p.name for p in folder.iterdir()) == ["node-0.json", "node-1.json",
                                                        "request.json"]
    node1 = json.loads((folder / "node-1.json").read_text())
    assert [r["rank"] for r in node1["ranks"]] == [2, 3]
    rank3 = node1["ranks"][1]["processes"][0]
    assert rank3["python"] and rank3["native"], rank3  # native frames where possible
    assert any(f["native"] for t in rank3["threads"] for f in t["frames"])

    # on demand: every node answers, rank 3's frame stands apart from the others'
    shown = yard.js("job", "stacks", "-n", "hangdump", "--timeout", "60")
    assert shown["reason"] == "request" and shown["missing"] == [], shown
    groups = {g["label"]: g for g in shown["groups"]}
    assert set(groups) == {"rank 3", "ranks 0-2"}, groups
    assert groups["rank 3"]["where"].startswith("in take_twice (hang.py:")
    assert groups["ranks 0-2"]["where"].startswith("in barrier (hang.py:")
    assert groups["ranks 0-2"]["nodes"] == [n["node"] for n in yard.node_reports(job)]
    text = yard.ok("job", "stacks", "hangdump").stdout
    lines = text.splitlines()
    odd = next(i for i, ln in enumerate(lines) if ln.startswith("rank 3 in take_twice"))
    rest = next(i for i, ln in enumerate(lines) if ln.startswith("ranks 0-2 in barrier"))
    assert odd < rest, text  # the odd one out first
    assert "    main (hang.py:" in text and "<module> (hang.py:" in text, text
    assert "lock.acquire" not in text  # folded frames, not source lines
    raw = yard.ok("job", "stacks", "hangdump", "--raw").stdout
    assert raw.count("-- rank ") >= 4 and "libc" in raw, raw  # every process, native too

    yard.ok("job", "terminate", "hangdump")
    # kept after the job ended; a new dump of an ended job is refused with the reason
    kept = yard.js("job", "stacks", "hangdump", "--list")
    assert [k["reason"] for k in kept] == ["hang", "request", "request", "request"], kept
    # oldest first by the time asked, not by id: an id's time is to the second, and the
    # watchdog's dump and the first request (or the requests) often share one
    assert kept[0]["id"] == ident, kept
    times = [k["requested_at"] for k in kept]
    assert times == sorted(times), kept
    again = yard.js("job", "stacks", "hangdump", "--id", ident)
    assert again["reason"] == "hang" and len(again["dumps"]) == 2
    refused = yard.cli("job", "stacks", "hangdump")
    assert refused.rc == 2 and "no running ranks" in refused.stderr, str(refused)
    assert "Traceback" not in refused.stderr
    missing = yard.cli("job", "stacks", "hangdump", "--id", "nosuch")
    assert missing.rc == 3 and "no stack dump" in missing.stderr, str(missing)
    yard.assert_no_process_left(yard.job("hangdump"))


def test_on_hang_fail_ends_the_job_naming_the_hang(yard: Yard, cluster2: str) -> None:
    submit(yard, cluster2, "hangfail", "fail")
    job = yard.wait_job("hangfail", timeout=180)
    assert job["state"] == "failed", job
    assert job["message"].startswith(f"hung: no rank progressed for {HANG_TIMEOUT}s"), job
    assert "rank 3 in take_twice (hang.py:" in job["message"], job
    assert [e["to"] for e in job["events"]].count("hung") == 1
    assert job["error"]["cause"] == "hung", job["error"]  # not a rank the teardown took down
    waited = yard.cli("job", "wait", "hangfail")
    assert waited.rc == 1 and "hung" in waited.stdout, str(waited)
    yard.assert_no_process_left(job)


def test_on_hang_requeue_starts_a_new_attempt_then_fails(yard: Yard, cluster2: str) -> None:
    """A requeue is bounded (max(1, max_retries) times): a job that hangs every time ends."""
    submit(yard, cluster2, "hangagain", "requeue")
    job = yard.wait_job("hangagain", timeout=240)
    assert job["state"] == "failed" and job["attempt"] == 2, job
    first, second = job["attempts"]
    assert first["state"] == "preempted" and first["message"].startswith("hung:"), first
    assert second["message"].endswith("(it hung in 2 attempts)"), second
    assert [e["to"] for e in job["events"]].count("hung") == 2
    assert len(yard.js("job", "stacks", "hangagain", "--list")) == 2  # one per attempt


MPI_HANG = """\
import os
import threading
import time

RANK = int(os.environ["OMPI_COMM_WORLD_RANK"])


def barrier():
    time.sleep(3600)


def take_twice():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


print(f"rank {RANK} started", flush=True)
take_twice() if RANK == 3 else barrier()
"""


@pytest.mark.mpi
def test_mpi_ranks_under_orted_are_found_on_every_node(yard: Yard, cluster2: str) -> None:
    """MPI ranks are children of mpirun (node 0) and of orted (node 1, started through the
    relay): each node finds its own by the attempt's process tag and Open MPI's rank."""
    name = "mpihang"
    path = yard.write_job(name, {
        "nodes": 2, "distribution": {"type": "mpi", "processes_per_node": 2},
        "command": "python mpihang.py", "code": str(yard.work / "jobs" / name),
        "limits": {"grace_period": 1, "max_wall_clock": 300}}, files={"mpihang.py": MPI_HANG})
    yard.ok("job", "create", "-f", str(path), "-n", name, "-c", cluster2)
    yard.wait_job(name, ("running",), timeout=120)

    def all_four() -> dict[str, Any] | None:
        shown: dict[str, Any] = yard.js("job", "stacks", name, "--timeout", "60")
        ranks = sorted(r for g in shown["groups"] for r in g["ranks"])
        return shown if ranks == [0, 1, 2, 3] and len(shown["groups"]) == 2 else None

    shown = wait_until(all_four, 60, 1.0, "every MPI rank to be up and dumped")
    groups = {g["label"]: g for g in shown["groups"]}
    assert groups["rank 3"]["where"].startswith("in take_twice (mpihang.py:"), groups
    assert groups["ranks 0-2"]["where"].startswith("in barrier (mpihang.py:"), groups
    assert groups["rank 3"]["nodes"] == [shown["nodes"][1]]
    yard.ok("job", "terminate", name)
    yard.assert_no_process_left(yard.job(name))
