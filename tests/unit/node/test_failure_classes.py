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


# --- what is not the error ---------------------------------------------------------------------

# Open MPI 4.1.4's mpirun (Debian), crashing in its teardown after a rank failed (seen here):
MPIRUN_TEARDOWN = """\
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
mpirun: abort is already in progress...hit ctrl-c again to forcibly terminate

[vm:00004] *** Process received signal ***
[vm:00004] Signal: Segmentation fault (11)
[vm:00004] Signal code: Address not mapped (1)
[vm:00004] Failing at address: (nil)
[vm:00004] [ 0] /lib/x86_64-linux-gnu/libc.so.6(+0x3c050)[0x7f0144704050]
[vm:00004] [ 1] /lib/x86_64-linux-gnu/libpmix.so.2(PMIx_Finalize+0x703)[0x7f0141650e83]
[vm:00004] [ 2] /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_pmix_ext3x.so(ext3x_client_\
finalize+0x39a)[0x7f0143ffa61a]
[vm:00004] [ 3] /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_ess_hnp.so(+0x3814)\
[0x7f01444c7814]
[vm:00004] [ 4] /lib/x86_64-linux-gnu/libevent_core-2.1.so.7(event_base_loop+0x49f)[0x7f01448c742f]
[vm:00004] [ 5] /usr/bin/mpirun(+0x13b9)[0x55c678a023b9]
[vm:00004] [ 6] /lib/x86_64-linux-gnu/libc.so.6(__libc_start_main+0x85)[0x7f01446ef305]
[vm:00004] *** End of error message ***
""".splitlines()
# a rank's own crash (its frames are the job's): that one is the error
RANK_CRASH = """\
[vm:00031] *** Process received signal ***
[vm:00031] Signal: Segmentation fault (11)
[vm:00031] [ 0] /lib/x86_64-linux-gnu/libc.so.6(+0x3c050)[0x7f50a1a5a050]
[vm:00031] [ 1] /lib/x86_64-linux-gnu/libmpi.so(MPI_Win_create+0xd2)[0x7f50983592a2]
[vm:00031] [ 2] /venv/bin/python(_start+0x21)[0x55e4abf2e081]
[vm:00031] *** End of error message ***
""".splitlines()
TORCH_EXIT = ("[W1204 20:11:45.123456789 ProcessGroupNCCL.cpp:1250] Warning: WARNING: "
              "destroy_process_group() was not called before program exit, which can leak "
              "resources. For more info, please see https://pytorch.org/docs/stable/"
              "distributed.html#shutdown (function operator())")


def test_exit_warnings_are_not_the_error_line() -> None:
    lines = ["epoch 3 loss nan", "fatal: the loss diverged, giving up",
             "vm:123:456 [0] NCCL INFO comm 0x55d1 rank 0 nranks 2 - Destroy COMPLETE",
             TORCH_EXIT]
    error = failure.record(failure.USER, node="n-0", rank=0, exit_code=2, lines=lines)
    assert error["summary"] == "fatal: the loss diverged, giving up", error
    assert error["lines"] == lines[:2]
    # after a traceback too: the exception stays the summary, the warning is not shown
    error = failure.record(failure.USER, node="n-0", exit_code=1,
                           lines=[*failure.clean(TRACEBACK), TORCH_EXIT])
    assert error["summary"] == "ValueError: boom on rank 3" and TORCH_EXIT not in error["lines"]
    # a warning alone is still shown: it is all the rank printed
    assert failure.record(failure.USER, node="n", exit_code=1, lines=[TORCH_EXIT])["lines"]


def test_mpiruns_teardown_crash_is_not_the_error_but_a_ranks_is() -> None:
    error = failure.record(failure.USER, node="n-0", exit_code=3, lines=MPIRUN_TEARDOWN)
    assert not any("Process received signal" in line for line in error["lines"]), error
    assert error["summary"] == "mpirun: abort is already in progress...hit ctrl-c again to " \
                               "forcibly terminate", error
    error = failure.record(failure.USER, node="n-1", exit_code=139, lines=RANK_CRASH)
    assert "[vm:00031] Signal: Segmentation fault (11)" in error["lines"], error


def test_mpiruns_teardown_crash_is_labelled_in_its_log(tmp_path: Path) -> None:
    from batchyard.node.mpi import label_teardown

    log = tmp_path / "n-0-mpirun.stderr.txt"
    log.write_text("\n".join(MPIRUN_TEARDOWN) + "\n")
    cause = "MPI rank 3 on node n-1 exited with code 3"
    assert label_teardown(log, cause) is True
    assert label_teardown(log, cause) is False  # once
    last = log.read_text().splitlines()[-1]
    assert last == (f"[batchyard] the signal report above is mpirun's own, printed while it "
                    f"tore the job down after {cause}: it is not the job's error")
    quiet = tmp_path / "n-0-mpirun.stderr.2.txt"
    quiet.write_text("\n".join(MPIRUN_TEARDOWN[:5]) + "\n")  # no report: nothing to label
    assert label_teardown(quiet, cause) is False and "[batchyard]" not in quiet.read_text()


def test_a_report_in_mpiruns_own_log_is_never_the_error(tmp_path: Path) -> None:
    """mpirun's log holds only its own and its daemons' reports (a rank's stderr goes to the
    rank's files): whatever its frames, it is not the job's error."""
    log = tmp_path / "n-0-mpirun.stderr.txt"
    log.write_text("\n".join(["mpirun noticed that process rank 3 exited on signal 9.",
                              *RANK_CRASH]) + "\n")
    empty = tmp_path / "n-1-rank3.stderr.txt"
    empty.write_text("")
    error = failure.rank_error(3, 3, "n-1", 0, [empty, log])
    assert error["lines"] == ["mpirun noticed that process rank 3 exited on signal 9."], error


def test_the_label_names_the_ranks_failure_or_nothing(tmp_path: Path) -> None:
    """A crash of mpirun is aftermath only when a rank failed first: the gang's abort names
    it (another node's rank) or this node's own failure did; else it is the error itself."""
    import json

    from batchyard.node.mpi import label_mpirun_teardown

    log, abort = tmp_path / "n-0-mpirun.stderr.txt", tmp_path / "abort.json"
    report = MPIRUN_TEARDOWN[MPIRUN_TEARDOWN.index("") + 1:]  # mpirun's crash, nothing before
    log.write_text("\n".join(report) + "\n")
    crash = "mpirun on node n-0 exited with code 139 (signal 11): killed by SIGSEGV"
    assert label_mpirun_teardown(log, abort, 0, crash, wait=0.3) is False
    assert "[batchyard]" not in log.read_text()
    said = tmp_path / "said.txt"  # mpirun said first that a rank failed
    said.write_text("\n".join(MPIRUN_TEARDOWN) + "\n")
    assert label_mpirun_teardown(said, abort, 0, crash, wait=0.3) is True
    assert "after a rank failed (mpirun says so above" in said.read_text()
    abort.write_text(json.dumps({"node_rank": 1, "message": "MPI rank 3 on node n-1 exited "
                                 "with code 3 (user code error)"}))
    assert label_mpirun_teardown(log, abort, 0, crash, wait=0.3) is True
    assert "tore the job down after MPI rank 3 on node n-1 exited with code 3 (user code " \
           "error): it is not" in log.read_text()
