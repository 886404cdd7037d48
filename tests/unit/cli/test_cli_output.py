"""What the CLI prints, without a server: tables in an 80-column terminal (names and states
never cut inside a word, the reason cut to one line before any other column goes, optional
columns left out first), tables in a pipe (one line per row, every column whole, as squeue),
human sizes and times, a job's final line, field views of clusters, and exit codes per error
kind."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
from rich.console import Console

from batchyard import errors
from batchyard.cli import cluster, common, job

LONG_REASON = ("waiting for 2 idle nodes: 0 idle, 2 running; the earliest start is when "
               "job train-big ends (in about 40 minutes)")


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Whatever `common.console` prints, as a terminal of that width (no colours) shows it."""
    def make(width: int = 80) -> io.StringIO:
        out = io.StringIO()
        monkeypatch.setattr(common, "console", Console(file=out, width=width,
                                                       force_terminal=True,
                                                       color_system=None))
        return out
    return make


@pytest.fixture
def pipe(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Whatever `common.console` prints into a pipe (COLUMNS=80 or not)."""
    def make(width: int = 80) -> io.StringIO:
        out = io.StringIO()
        monkeypatch.setattr(common, "console", Console(file=out, width=width,
                                                       color_system=None))
        return out
    return make


def job_row(name: str, state: str = "queued", **extra: Any) -> dict[str, Any]:
    return {"name": name, "experiment": "hyperparameter-sweep", "cluster": "gpu-cluster-a",
            "state": state, "nodes": 2, "processes_per_node": 4, "duration": 125.0,
            "exit_code": None, "pending_reason": LONG_REASON if state == "queued" else None,
            "message": None, **extra}


def lines_of(out: io.StringIO) -> list[str]:
    return [line.rstrip() for line in out.getvalue().splitlines()]


def test_job_table_keeps_names_and_states_whole_at_80(
        screen: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = screen(80)
    names = ["resnet50-lr0.1-bs256-seed1", "resnet50-lr0.01-bs256-seed2", "bert-finetune"]
    rows = [job._row(job_row(n)) for n in names[:2]] + \
        [job._row(job_row(names[2], "succeeded", exit_code=0))]
    common.table(rows, job.COLUMNS)
    text = lines_of(out)
    assert all(len(line) <= 80 for line in text), text
    body = "\n".join(text)
    for name in names:
        assert name in body, body  # whole, on one line
    assert "succeeded" in body and "queued" in body
    assert "…" not in body  # no identifier cut
    assert len(text) == 1 + len(rows), body  # one line per job: nothing wraps
    # what did not fit is said, not dropped without a word (issue 33 #14)
    note = capsys.readouterr().err
    assert "left out at 80 columns" in note and "Experiment" in note, note
    assert "pipe or -o json" in note


def test_at_80_columns_the_reason_is_cut_not_the_other_columns(
        screen: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 33 #14: in an 80-column terminal Experiment, Cluster, Nodes and Duration stay;
    the reason is cut to what is left (one line per job)."""
    out = screen(80)
    rows = [job._row(job_row("job1", experiment="chainer_experiment", cluster="d3")),
            job._row(job_row("job2", "succeeded", exit_code=0, experiment="chainer_experiment",
                             cluster="d3"))]
    common.table(rows, job.COLUMNS)
    text = lines_of(out)
    assert len(text) == 3 and all(len(line) <= 80 for line in text), text
    for header in ("Name", "Experiment", "Cluster", "State", "Nodes", "Duration", "Exit",
                   "Reason"):
        assert header in text[0], text
    first = text[1]
    for value in ("job1", "chainer_experiment", "d3", "queued", "2 x 4", "2m05s"):
        assert value in first, text
    assert "waiting" in first and first.endswith("…"), text
    # nothing else left out: the submitter column (issue 32) gives way to the reason first
    assert capsys.readouterr().err.startswith("(By: left out at 80 columns")
    # narrower: the reason goes before any other column
    narrow = screen(70)
    common.table(rows, job.COLUMNS)
    text = lines_of(narrow)
    for value in ("job1", "chainer_experiment", "d3", "queued", "2 x 4", "2m05s"):
        assert value in text[1], text
    assert "Reason" not in text[0] and "waiting" not in text[1], text
    assert "Reason / message: left out at 70 columns" in capsys.readouterr().err


def test_a_pipe_gets_one_line_per_job_with_every_column(pipe: Any) -> None:
    """Issue 33 #14: piped, `job list` prints as squeue does, whatever the width."""
    out = pipe(80)
    names = ["resnet50-lr0.1-bs256-seed1", "bert-finetune"]
    rows = [job._row(job_row(names[0], message="line one\nline two")),
            job._row(job_row(names[1], "succeeded", exit_code=0))]
    common.table(rows, job.COLUMNS)
    text = lines_of(out)
    assert len(text) == 3, text
    assert text[0].split() == ["Name", "Experiment", "Cluster", "State", "By", "Nodes",
                               "Duration", "Exit", "Reason", "/", "message"]
    assert text[1].startswith("resnet50-lr0.1-bs256-seed1  hyperparameter-sweep  "
                              "gpu-cluster-a  queued")
    assert text[1].endswith(LONG_REASON) and "…" not in out.getvalue()  # whole, one line
    assert text[2].split()[:9] == ["bert-finetune", "hyperparameter-sweep", "gpu-cluster-a",
                                   "succeeded", "-", "2", "x", "4", "2m05s"]
    columns = [line.index(word) for line, word in zip(text, ("State", "queued", "succeeded"),
                                                       strict=True)]
    assert len(set(columns)) == 1, text  # aligned as columns
    assert "\x1b" not in out.getvalue()  # no styles in a pipe
    lines = pipe(80)
    common.table([{"name": "x", "message": "a\nb\tc"}], [("name", "Name"),
                                                          ("message", "Message", "text")])
    assert lines_of(lines) == ["Name  Message", "x     a b c"]


def test_optional_columns_go_first_on_a_narrow_terminal(screen: Any) -> None:
    wide = screen(200)
    rows = [job._row(job_row("resnet50-lr0.1-bs256-seed1"))]
    common.table(rows, job.COLUMNS)
    assert "Experiment" in wide.getvalue() and "Cluster" in wide.getvalue()
    narrow = screen(60)
    common.table(rows, job.COLUMNS)
    text = narrow.getvalue()
    assert "resnet50-lr0.1-bs256-seed1" in text and "queued" in text
    assert "Experiment" not in text  # left out, not folded
    assert all(len(line.rstrip()) <= 60 for line in text.splitlines())


def test_empty_list_says_so(screen: Any, capsys: pytest.CaptureFixture[str]) -> None:
    out = screen(80)
    common.table([], job.COLUMNS, empty="no jobs in workspace default")
    assert out.getvalue() == ""
    assert "no jobs in workspace default" in capsys.readouterr().err


def test_human_forms() -> None:
    assert common.human_size(0) == "0 B"
    assert common.human_size(512) == "512 B"
    assert common.human_size(1536) == "1.5 KiB"
    assert common.human_size(20 * 2**20) == "20.0 MiB"
    now = time.time()
    assert common.human_time(now - 300, now).endswith("(5m ago)")
    assert common.human_time(now + 7200, now).endswith("(in 2h)")
    assert common.human_time(None) == "-"
    assert common.counts({"idle": 2, "running": 0, "unusable": 1}) == "2 idle, 1 unusable"
    assert common.counts({"idle": 0}) == "none"


def test_cell_has_no_raw_json() -> None:
    assert common._cell({"loss": 0.25, "acc": 0.9}) == "loss=0.25, acc=0.9"
    assert common._cell(["n-0", "n-1"]) == "n-0, n-1"
    assert common._cell(True) == "yes"


@pytest.mark.parametrize(("data", "line"), [
    ({"state": "succeeded", "duration": 3.2}, "job j succeeded in 3.2s"),
    ({"state": "failed", "exit_code": 7, "duration": 3.0, "message": "rank 1 exited 7"},
     "job j failed with exit code 7 after 3.0s: rank 1 exited 7"),
    ({"state": "canceled", "started_at": None, "message": "terminated by user before it "
      "started"}, "job j canceled before it started (it was queued)"),
    ({"state": "canceled", "started_at": 1.0, "duration": 61.0},
     "job j canceled after 1m01s"),
    ({"state": "queued", "pending_reason": "waiting for 2 idle nodes"},
     "job j is queued: waiting for 2 idle nodes"),
])
def test_final_line_reads_naturally(data: dict[str, Any], line: str) -> None:
    assert job.final_line({"name": "j", **data}) == line


def test_exit_codes_of_the_job_and_of_the_cli() -> None:
    assert job.job_exit_code({"state": "succeeded"}) == 0
    assert job.job_exit_code({"state": "failed", "exit_code": 2}) == 2
    assert job.job_exit_code({"state": "failed", "exit_code": None}) == 1
    assert job.job_exit_code({"state": "canceled"}) == 130
    assert common.exit_code_of(errors.SpecError("x")) == common.EXIT_BAD_INPUT == 2
    assert common.exit_code_of(errors.Conflict("x")) == 2
    assert common.exit_code_of(errors.NotFound("x")) == common.EXIT_NOT_FOUND == 3
    assert common.exit_code_of(errors.ServerUnavailable("x")) == common.EXIT_UNREACHABLE == 4
    assert common.exit_code_of(errors.BatchyardError("x")) == 1


def test_cluster_show_prints_fields_not_dicts(screen: Any) -> None:
    out = screen(80)
    cluster._render_show({
        "name": "gpu", "backend": "local", "vm_size": "Standard_NC6",
        "size": {"name": "Standard_NC6", "vcpus": 6, "gpus": 1, "memory_gb": 56,
                 "family": "standardNCFamily", "gpu_model": "K80"},
        "vm_priority": "dedicated",
        "scale": {"autoscale": {"min_nodes": 0, "max_nodes": 4,
                                "idle_seconds_before_scaledown": 600}},
        "allocation_state": "steady", "target_nodes": 0, "current_nodes": 2,
        "node_counts": {"idle": 1, "running": 1, "preparing": 0}, "created_at": time.time()})
    text = out.getvalue()
    assert "{" not in text and "}" not in text, text
    assert "autoscale, 0-4 nodes, idle 600s before scale-down" in text
    assert "6 vCPU, 1 GPU (K80), 56 GB memory" in text
    assert "1 idle, 1 running" in text
    assert "Node states" in text and "node_counts" not in text


def test_job_show_uses_plain_labels(screen: Any) -> None:
    out = screen(80)
    job._render_show({**job_row("j1", "succeeded", exit_code=0), "workspace": "default",
                      "priority": "normal", "distribution": "pytorch", "attempt": 1,
                      "submitted_at": time.time(), "assigned_nodes": [],
                      "source_format": "batchai", "metrics": {"loss": 0.5}})
    text = out.getvalue()
    for label in ("Name", "State", "Exit code", "Nodes x processes", "Submitted",
                  "Job file format", "Latest metrics"):
        assert label in text, text
    for raw in ("pending_reason", "nodes_x", "source_format", "dur "):
        assert raw not in text, text
    assert "loss=0.5" in text
