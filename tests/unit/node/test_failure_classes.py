"""The pure failure classifier: cause classes from exit codes and what a rank printed, the
error lines kept (the last traceback, capped) and the one-line message."""

from __future__ import annotations

from pathlib import Path

from batchyard.node import failure

TRACEBACK = """\
starting
[rank3]: Traceback (most recent call last):
[rank3]:   File "/job/train.py", line 9, in <module>
[rank3]:     main()
[rank3]:   File "/job/train.py", line 7, in main
[rank3]:     raise ValueError("boom on rank 3")
[rank3]: ValueError: boom on rank 3
""".splitlines()

GLOO = """\
Traceback (most recent call last):
  File "/job/t.py", line 3, in <module>
    dist.all_reduce(t)
RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] \
Timed out waiting 5000ms for recv operation to complete
""".splitlines()

STORE = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
         "torch.distributed.DistStoreError: Timed out after 6 seconds waiting for clients. "
         "1/2 clients joined."]
NCCL = ["[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
        "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600010 milliseconds before timing out."]
CUDA = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
MEMORY = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
          "MemoryError"]


def test_a_traceback_is_a_user_code_error_with_its_exception() -> None:
    lines = failure.clean(TRACEBACK)
    assert failure.classify(1, lines) == failure.USER
    assert failure.exception_line(lines) == "ValueError: boom on rank 3"
    kept = failure.error_lines(lines)
    assert kept[0].startswith("Traceback") and kept[-1] == "ValueError: boom on rank 3"
    error = failure.record(failure.USER, node="local2-1", rank=3, exit_code=1, lines=lines)
    assert failure.message_of(error) == \
        "rank 3 on node local2-1 failed (user code error): ValueError: boom on rank 3"
    assert failure.message_of(error, "rank 3 on node local2-1 exited with code 1") == \
        "rank 3 on node local2-1 exited with code 1 (user code error): ValueError: boom on rank 3"


def test_timeouts_of_gloo_the_store_and_nccl() -> None:
    for lines in (GLOO, STORE, NCCL):
        assert failure.classify(1, lines) == failure.TIMEOUT, lines


def test_out_of_memory_by_text_or_by_the_kernel() -> None:
    assert failure.classify(1, CUDA) == failure.OOM
    assert failure.classify(1, MEMORY) == failure.OOM
    assert failure.classify(137, [], oom_killed=True) == failure.OOM
    assert failure.summary_of(failure.OOM, 137, []) == "killed by SIGKILL (out of memory)"


def test_signals_by_shell_code_or_negative_code() -> None:
    assert failure.classify(139, []) == "signal 11"
    assert failure.classify(-9, ["some output"]) == "signal 9"
    assert failure.classify(137, []) == "signal 9"
    assert failure.summary_of("signal 11", 139, []) == "killed by SIGSEGV"
    # a traceback printed before the process aborted (gloo's SIGABRT at exit): the exception
    assert failure.classify(134, failure.clean(TRACEBACK)) == failure.USER
    assert failure.classify(2, ["usage: train.py [-h]"]) == failure.USER
    assert failure.signal_of(0) is None and failure.signal_of(1) is None
    assert failure.signal_of(-1) is None  # the launcher's "gone without an exit status"


def test_error_lines_are_capped_in_lines_and_bytes(tmp_path: Path) -> None:
    many = [f"line {i}" for i in range(500)]
    assert failure.error_lines(many) == many[-failure.MAX_LINES:]
    wide = ["x" * 1000 for _ in range(30)]
    kept = failure.error_lines(wide)
    assert sum(len(line.encode()) + 1 for line in kept) <= failure.MAX_BYTES
    assert all(len(line) <= failure.MAX_LINE + 1 for line in kept)
    log = tmp_path / "r.stderr.txt"
    log.write_bytes(b"junk\n" * 40000 + b"\xff bad bytes\nlast line\n")
    assert failure.read_tail(log)[-2:] == ["\ufffd bad bytes", "last line"]
    assert failure.read_tail(tmp_path / "missing") == []


def test_the_first_cause_by_time_wins() -> None:
    later = failure.record(failure.USER, node="n-0", rank=0, at=20.0)
    earlier = failure.record("signal 9", node="n-1", rank=3, at=10.0)
    assert failure.first([later, None, earlier]) is earlier
    assert failure.first([None]) is None


def test_node_errors_without_a_rank() -> None:
    pulled = failure.node_error("failed", {"message": "on node n-0: image x not found",
                                           "cause": failure.IMAGE_PULL}, "n-0", 0, False)
    assert pulled is not None and pulled["cause"] == failure.IMAGE_PULL
    assert failure.message_of(pulled) == \
        "node n-0 failed (image pull failed): on node n-0: image x not found"
    staged = failure.node_error("failed", {"message": "input x missing"}, "n-0", 0, False)
    assert staged is not None and staged["cause"] == failure.PREPARATION
    assert failure.node_error("failed", {"message": "?"}, "n-0", 0, True) is None
    assert failure.node_error("succeeded", {}, "n-0", 0, True) is None
    prep = failure.record(failure.PREPARATION, node="n-0", what="prepare", exit_code=3,
                          lines=["no such file"])
    assert failure.message_of(prep) == \
        "job prepare on node n-0 failed (preparation failed): no such file"


def test_oom_kills_counter_of_a_cgroup(tmp_path: Path) -> None:
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert failure.oom_kills(tmp_path) == 2
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert failure.oom_kills(v1) == 5
    assert failure.oom_kills(tmp_path / "none") is None
