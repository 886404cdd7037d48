"""Azure ML's shapes built from batchyard's views (details, metrics, file names, statuses),
the config-file search of Workspace.from_config, and RunDetails' rendering."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchyard.compat.azureml._common import aml_status, iso
from batchyard.compat.azureml._details import aggregate_metrics, run_details
from batchyard.compat.azureml._submission import aml_file_name, new_run_id, script_arguments
from batchyard.compat.azureml.core.workspace import Workspace, find_config
from batchyard.compat.azureml.exceptions import UserErrorException
from batchyard.compat.azureml.widgets.run_details import Snapshot, render_html, render_text
from batchyard.sdk.workspace import Workspace as SdkWorkspace


def test_statuses_and_times() -> None:
    assert [aml_status(s) for s in ("queued", "preparing", "running", "finalizing",
                                    "succeeded", "failed", "canceled", None)] == \
        ["Queued", "Preparing", "Running", "Finalizing", "Completed", "Failed", "Canceled",
         "NotStarted"]
    assert iso(0.5) == "1970-01-01T00:00:00.500000Z" and iso(None) is None


def test_get_metrics_shape() -> None:
    rows = [
        {"name": "acc", "kind": "scalar", "value": 0.9},
        {"name": "loss", "kind": "scalar", "value": 1.0},
        {"name": "loss", "kind": "scalar", "value": 0.5},
        {"name": "loss", "kind": "scalar", "value": float("nan")},
        {"name": "curve", "kind": "list", "value": [1, 2]},
        {"name": "epochs", "kind": "row", "value": {"epoch": 1, "loss": 0.3}},
        {"name": "epochs", "kind": "row", "value": {"epoch": 2, "loss": 0.2}},
        {"name": "tbl", "kind": "table", "value": {"x": [1, 2], "y": [3, 4]}},
        {"name": "tbl", "kind": "table", "value": {"x": [5], "y": [6]}},
    ]
    got = aggregate_metrics(rows)
    assert got["acc"] == 0.9 and got["loss"][:2] == [1.0, 0.5] and math.isnan(got["loss"][2])
    assert got["curve"] == [1, 2]
    assert got["epochs"] == {"epoch": [1, 2], "loss": [0.3, 0.2]}
    assert got["tbl"] == {"x": [1, 2, 5], "y": [3, 4, 6]}


def test_run_details_shape() -> None:
    job = {"name": "exp_1_abc", "cluster": "gpucluster", "state": "failed", "started_at": 10.0,
           "ended_at": 20.0, "workspace": "w", "experiment": "exp", "attempt": 1,
           "exit_code": 3, "message": "rank 1 on node n-1 exited with code 3", "nodes": 2,
           "spec": {"command": ["python", "train.py", "--epochs", "2"], "code": "snapshot:ab",
                    "distribution": {"type": "mpi", "processes_per_node": 1},
                    "env": {"A": "1"}, "tags": {"azureml.framework": "PyTorch"}}}
    files = [{"path": "stdouterr/n-0-rank0.stdout.txt"}, {"path": "outputs/OUTPUTS/m.pt"}]
    details = run_details(job, files, "http://h/files/content")
    assert details["runId"] == "exp_1_abc" and details["status"] == "Failed"
    assert details["target"] == "gpucluster"
    assert details["startTimeUtc"] == "1970-01-01T00:00:10.000000Z"
    assert details["runDefinition"]["script"] == "train.py"
    assert details["runDefinition"]["arguments"] == ["--epochs", "2"]
    assert details["runDefinition"]["communicator"] == "Mpi"
    assert details["runDefinition"]["framework"] == "PyTorch"
    assert details["properties"]["ContentSnapshotId"] == "ab"
    assert list(details["logFiles"]) == ["stdouterr/n-0-rank0.stdout.txt"]
    assert "exited with code 3" in details["error"]["error"]["message"]
    json.dumps(details)


def test_file_names_and_arguments_and_run_ids() -> None:
    assert aml_file_name("outputs/OUTPUTS/model.pt") == "outputs/model.pt"
    assert aml_file_name("outputs/LOGS/tb/events") == "logs/tb/events"
    assert aml_file_name("stdouterr/n-0-rank0.stdout.txt") == "stdouterr/n-0-rank0.stdout.txt"
    assert script_arguments({"--a": 1, "--b": "", "--c": None, "-d": "x y"}) == \
        ["--a", "1", "--b", "--c", "-d", "x y"]
    run_id = new_run_id("e" * 80)
    assert len(run_id) == 64 and run_id.startswith("e" * 44 + "_")


def test_find_config_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    (tmp_path / "config.json").write_text("{}")
    assert find_config(str(deep)) == tmp_path / "config.json"
    (tmp_path / "a" / "aml_config").mkdir()
    (tmp_path / "a" / "aml_config" / "config.json").write_text("{}")
    assert find_config(str(deep)) == tmp_path / "a" / "aml_config" / "config.json"
    (deep / ".azureml").mkdir()
    (deep / ".azureml" / "config.json").write_text("{}")
    monkeypatch.chdir(deep)
    assert find_config() == deep / ".azureml" / "config.json"
    assert find_config(str(tmp_path / "config.json")) == tmp_path / "config.json"
    with pytest.raises(UserErrorException, match=r"could not find other\.json"):
        find_config(str(deep), "other.json")


def test_write_config_writes_both_locations(tmp_path: Path) -> None:
    sdk = SdkWorkspace("ws1", data={"name": "ws1", "subscription_id": "sub",
                                    "resource_group": "rg"})
    Workspace._wrap(sdk).write_config(str(tmp_path))
    for folder in (".azureml", "aml_config"):
        body = json.loads((tmp_path / folder / "config.json").read_text())
        assert body == {"subscription_id": "sub", "resource_group": "rg",
                        "workspace_name": "ws1"}


def test_run_details_snapshot_and_rendering() -> None:
    snap = Snapshot("run1", status="Running", target="c2", started=1.0, ended=11.0)
    snap.add_log("[c2-0/rank0] epoch 1\n[c2-0/rank0] epoch 2\n[c2-1/rank1:err] warn <b>\n")
    snap.add_metrics([{"name": "loss", "value": 0.5, "step": 1, "rank": 0},
                      {"name": "loss", "value": 0.25, "step": 2, "rank": 0}])
    assert snap.nodes["c2-0"]["rank0"].lines == 2 and snap.nodes["c2-0"]["rank0"].last == \
        "epoch 2"
    assert snap.metrics["loss"]["count"] == 2 and snap.duration == "10s"
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(render_text(snap))
    text = console.export_text()
    assert "Running" in text and "epoch 2" in text and "0.25" in text and "c2-1" in text
    page = render_html(snap)
    assert "warn &lt;b&gt;" in page and "<td>loss</td>" in page


class _FakeJob:
    """Just enough of batchyard.sdk.job.Job for RunDetails: running, then succeeded."""

    def __init__(self) -> None:
        self.calls = 0

    def refresh(self) -> dict:
        self.calls += 1
        state = "running" if self.calls < 3 else "succeeded"
        return {"state": state, "cluster": "c2", "started_at": 1.0, "ended_at": None}

    def metrics(self, after: int | None = None) -> list[dict]:
        return [] if after else [{"id": 1, "name": "acc", "value": 0.93, "step": None,
                                  "rank": 0}]

    def logs(self, follow: bool = False) -> Iterator[str]:
        yield "[c2-0/rank0] training\n"


class _FakeRun:
    id = "run-nb"

    def __init__(self) -> None:
        self.job = _FakeJob()


def test_run_details_in_jupyter_updates_an_ipywidget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebook path with stand-ins for IPython and ipywidgets (neither is a dependency):
    the widget is displayed once and then updated until the run ends."""
    import sys
    import time
    import types

    from batchyard.compat.azureml.widgets import run_details

    shown: list[object] = []

    class HTMLWidget:
        def __init__(self, value: str = "") -> None:
            self.value = value

    display_mod = types.ModuleType("IPython.display")
    display_mod.display = lambda obj, **_kw: shown.append(obj)  # type: ignore[attr-defined]
    display_mod.HTML = lambda text: text  # type: ignore[attr-defined]
    ipython = types.ModuleType("IPython")
    ipython.display = display_mod  # type: ignore[attr-defined]
    widgets = types.ModuleType("ipywidgets")
    widgets.HTML = HTMLWidget  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", display_mod)
    monkeypatch.setitem(sys.modules, "ipywidgets", widgets)
    monkeypatch.setattr(run_details, "_in_jupyter", lambda: True)

    details = run_details.RunDetails(_FakeRun())
    details.show(refresh_seconds=0.05)  # returns at once in a notebook
    assert len(shown) == 1 and isinstance(shown[0], HTMLWidget)
    deadline = time.monotonic() + 5
    while "Completed" not in shown[0].value and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "Completed" in shown[0].value and "<td>acc</td>" in shown[0].value


def test_run_details_error_carries_the_failure_cause() -> None:
    error = {"cause": "oom", "rank": 3, "node": "n-1", "exit_code": 137,
             "lines": ["Traceback (most recent call last):", "MemoryError"],
             "summary": "MemoryError"}
    job = {"name": "r", "state": "failed", "exit_code": 137, "ended_at": 20.0, "error": error,
           "message": "rank 3 on node n-1 exited with code 137 (oom): MemoryError"}
    got = run_details(job, [], "http://h")["error"]
    assert got["error"]["code"] == "UserError" and got["error"]["message"] == job["message"]
    assert got["error"]["innerError"] == {"code": "OutOfMemory"}
    assert got["error"]["additionalInfo"] == [{"type": "BatchyardFailure", "info": error}]
    assert got["error"]["details"][0]["message"].endswith("MemoryError")
    assert got["time"] == "1970-01-01T00:00:20.000000Z"
    lost = run_details({**job, "error": {**error, "cause": "node lost"}}, [], "h")["error"]
    assert lost["error"]["code"] == "SystemError"
    assert lost["error"]["innerError"] == {"code": "NodeLost"}


class _FlakyJob(_FakeJob):
    """Running, then the server is away for one read (a restart), then succeeded."""

    def refresh(self) -> dict:
        self.calls += 1
        if self.calls == 2:
            from batchyard.errors import ServerUnavailable

            raise ServerUnavailable("connection refused")
        state = "running" if self.calls < 4 else "succeeded"
        return {"state": state, "cluster": "c2", "started_at": 1.0, "ended_at": None}


class _FlakyRun(_FakeRun):
    def __init__(self) -> None:
        self.job = _FlakyJob()


def test_run_details_in_a_notebook_outlives_a_failed_read(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Issue 33 #20: the notebook view keeps updating after the server was away once (its
    background loop died with the first failed read)."""
    import sys
    import time
    import types

    from batchyard.compat.azureml.widgets import run_details

    handles: list[list[str]] = []

    class Handle:
        def __init__(self, first: str) -> None:
            self.shown = [first]
            handles.append(self.shown)

        def update(self, obj: str) -> None:
            self.shown.append(obj)

    display_mod = types.ModuleType("IPython.display")
    display_mod.display = lambda obj, **_kw: Handle(obj)  # type: ignore[attr-defined]
    display_mod.HTML = lambda text: text  # type: ignore[attr-defined]
    ipython = types.ModuleType("IPython")
    ipython.display = display_mod  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", display_mod)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # not installed: a display handle
    monkeypatch.setattr(run_details, "_in_jupyter", lambda: True)

    run_details.RunDetails(_FlakyRun()).show(refresh_seconds=0.05)
    deadline = time.monotonic() + 5
    while not (handles and "Completed" in handles[0][-1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    shown = handles[0]
    assert "Running" in shown[0] and "Completed" in shown[-1], shown[-1]
    assert any("did not answer" in page for page in shown)


def _console_into(monkeypatch: pytest.MonkeyPatch, terminal: bool) -> Any:
    import io

    from rich.console import Console

    from batchyard.compat.azureml.widgets import run_details

    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=100,
                      color_system="standard" if terminal else None)
    monkeypatch.setattr(run_details, "_console", lambda: console, raising=False)
    monkeypatch.setattr(run_details, "_in_jupyter", lambda: False)
    monkeypatch.setattr("rich.console.Console", lambda *a, **k: console)
    return out


def test_run_details_in_a_terminal_is_a_live_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33 #20: a terminal gets the table redrawn while the run goes (Running, then
    Completed), and a failed read does not end it."""
    from batchyard.compat.azureml.widgets import run_details

    out = _console_into(monkeypatch, terminal=True)
    run_details.RunDetails(_FlakyRun()).show(refresh_seconds=0.02)
    text = out.getvalue()
    assert text.count("Status") >= 3, text  # frames, redrawn in place
    assert "\x1b[" in text  # cursor moves: a live view
    assert text.index("Running") < text.rindex("Completed"), text


def test_run_details_in_a_pipe_prints_one_final_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from batchyard.compat.azureml.widgets import run_details

    out = _console_into(monkeypatch, terminal=False)
    run_details.RunDetails(_FlakyRun()).show(refresh_seconds=0.02)
    text = out.getvalue()
    assert text.count("Status") == 1 and "Completed" in text and "Running" not in text, text
    assert "\x1b" not in text and "acc" in text
