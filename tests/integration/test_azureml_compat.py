"""batchyard.compat.azureml against a real server and real jobs: workspaces and their config
files, compute targets, estimators and ScriptRunConfig runs (live logs, details, metrics,
tags, files), failures, cancellation, per-job pip packages, the default datastore and
RunDetails."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchyard.compat.azureml.core import Environment, Experiment, ScriptRunConfig
from batchyard.compat.azureml.core.compute import AmlCompute, ComputeTarget
from batchyard.compat.azureml.core.compute_target import ComputeTargetException
from batchyard.compat.azureml.core.run import Run
from batchyard.compat.azureml.core.runconfig import PyTorchConfiguration
from batchyard.compat.azureml.core.workspace import Workspace
from batchyard.compat.azureml.exceptions import (
    ActivityFailedException,
    ProjectSystemException,
    WorkspaceException,
)
from batchyard.compat.azureml.train.estimator import Estimator
from batchyard.compat.azureml.widgets import RunDetails
from batchyard.sdk import set_default_client

pytestmark = pytest.mark.timeout(240)
WS, SUB, RG = "aml-ws", "11111111-2222-3333-4444-555555555555", "aml-rg"


@pytest.fixture(scope="module")
def env(yard) -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BATCHYARD_HOME", str(yard.home))
        for key in ("BATCHYARD_SERVER", "BATCHYARD_TOKEN", "BATCHYARD_API",
                    "BATCHYARD_DATA_ROOT"):
            mp.delenv(key, raising=False)
        set_default_client(None)
        yield yard
        set_default_client(None)


@pytest.fixture(scope="module")
def ws(env: Any) -> Workspace:
    return Workspace.create(name=WS, subscription_id=SUB, resource_group=RG,
                            create_resource_group=True, location="eastus")


@pytest.fixture(scope="module")
def target(ws: Workspace) -> AmlCompute:
    config = AmlCompute.provisioning_configuration(vm_size="STANDARD_NC6",
                                                   vm_priority="lowpriority", max_nodes=2)
    created = ComputeTarget.create(ws, "gpucluster", config)
    created.wait_for_completion(show_output=False)
    return created


def source(folder: Path, files: dict[str, str]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    return str(folder)


def test_workspace_config_round_trip(ws: Workspace, env: Any, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert (ws.name, ws.subscription_id, ws.resource_group, ws.location) == \
        (WS, SUB, RG, "eastus")
    ws.write_config(path=str(tmp_path))
    for folder in (".azureml", "aml_config"):
        assert json.loads((tmp_path / folder / "config.json").read_text()) == {
            "subscription_id": SUB, "resource_group": RG, "workspace_name": WS}
    nested = tmp_path / "notebooks" / "deeper"
    nested.mkdir(parents=True)
    monkeypatch.chdir(nested)
    found = Workspace.from_config()
    assert found == ws and found.resource_group == RG
    assert "Found the config file in" in capsys.readouterr().out
    assert Workspace.from_config(path=str(tmp_path / "aml_config" / "config.json")) == ws
    assert Workspace.get(WS, subscription_id=SUB, resource_group=RG) == ws
    assert Workspace(SUB, RG, WS) == ws
    with pytest.raises(WorkspaceException, match="resource_group"):
        Workspace.get(WS, resource_group="another-rg")
    with pytest.raises(ProjectSystemException):
        Workspace.get("missing-ws")
    with pytest.raises(WorkspaceException, match="already exists"):
        Workspace.create(WS, subscription_id=SUB, resource_group=RG)
    assert Workspace.create(WS, exist_ok=True, show_output=False) == ws
    assert WS in Workspace.list(subscription_id=SUB)
    assert ws.get_details()["resourceGroup"] == RG
    assert ws.get_default_datastore().name == "workspaceblobstore"


def test_compute_target_lookup_create_and_status(ws: Workspace,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ComputeTargetException, match="not found"):
        ComputeTarget(workspace=ws, name="nocluster")
    config = AmlCompute.provisioning_configuration(vm_size="STANDARD_NC6",
                                                   vm_priority="lowpriority", min_nodes=1,
                                                   max_nodes=2)
    created = ComputeTarget.create(ws, "status-c", config)
    assert created.provisioning_state == "Creating"
    created.wait_for_completion(show_output=True)
    out = capsys.readouterr().out
    assert "Creating" in out and "Succeeded" in out and "have been provisioned" in out
    found = ComputeTarget(workspace=ws, name="status-c")
    assert isinstance(found, AmlCompute) and found.type == "AmlCompute"
    status = found.status.serialize()
    assert status["vmPriority"] == "LowPriority" and status["vmSize"] == "Standard_NC6"
    assert status["scaleSettings"] == {"minNodeCount": 1, "maxNodeCount": 2,
                                       "nodeIdleTimeBeforeScaleDown": "PT120S"}
    assert status["currentNodeCount"] == 1 and status["allocationState"] == "Steady"
    assert status["nodeStateCounts"]["idleNodeCount"] == 1
    assert found.get_status().serialize().keys() == status.keys()
    assert found.provisioning_state == "Succeeded"
    assert "status-c" in ws.compute_targets and len(found.list_nodes()) == 1
    with pytest.raises(ComputeTargetException, match="already exists"):
        ComputeTarget.create(ws, "status-c", config)
    found.delete()
    with pytest.raises(ComputeTargetException):
        ComputeTarget(workspace=ws, name="status-c")


TRAIN = """\
    import os, sys
    from batchyard.compat.azureml.core.run import Run
    run = Run.get_context()
    assert Run.get_context() is run
    print("args", sys.argv[1:], os.environ["GREETING"], flush=True)
    run.log("accuracy", 0.5)
    run.log("accuracy", 0.75, step=2)
    run.log_list("curve", [1, 2, 3])
    run.log_row("epochs", epoch=1, loss=0.3)
    run.log_row("epochs", epoch=2, loss=0.2)
    run.log_table("tbl", {"x": [1, 2], "y": [3, 4]})
    run.tag("from_inside", "yes")
    os.makedirs("outputs/sub", exist_ok=True)
    open("outputs/model.txt", "w").write("model\\n")
    open("outputs/sub/extra.txt", "w").write("x")
    open("logs/train.log", "w").write("log\\n")
    print("inside sees", run.get_metrics()["accuracy"], run.get_file_names(), flush=True)
    run.complete()
    """


def test_estimator_run_details_metrics_tags_files(ws: Workspace, target: AmlCompute,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    src = source(tmp_path / "est", {"train.py": TRAIN})
    est = Estimator(source_directory=src, compute_target=target, entry_script="train.py",
                    script_params={"--epochs": 2}, environment_variables={"GREETING": "hi"},
                    pip_packages=["numpy"], use_docker=True)
    experiment = Experiment(ws, name="aml-exp")
    run = experiment.submit(est, tags={"kind": "estimator"})
    print(run)
    assert "Run(Experiment: aml-exp" in capsys.readouterr().out
    details = run.wait_for_completion(show_output=True)
    out = capsys.readouterr().out
    assert "[gpucluster-0/rank0] args ['--epochs', '2'] hi" in out, out
    assert "inside sees [0.5, 0.75]" in out and "outputs/model.txt" in out
    assert "Execution Summary" in out and f"RunId: {run.id}" in out
    assert details["status"] == "Completed" and details["runId"] == run.id
    assert details["target"] == "gpucluster" and details["endTimeUtc"].endswith("Z")
    assert details["runDefinition"]["script"] == "train.py"
    assert any(name.endswith("rank0.stdout.txt") for name in details["logFiles"])
    assert run.get_status() == "Completed"

    assert run.get_metrics() == {"accuracy": [0.5, 0.75], "curve": [1, 2, 3],
                                 "epochs": {"epoch": [1, 2], "loss": [0.3, 0.2]},
                                 "tbl": {"x": [1, 2], "y": [3, 4]}}
    assert run.get_metrics("curve") == {"curve": [1, 2, 3]}
    run.tag("outside", "1")
    tags = run.get_tags()
    assert tags["kind"] == "estimator" and tags["from_inside"] == "yes"
    assert tags["outside"] == "1" and tags["azureml.framework"] == "Python"

    names = run.get_file_names()
    assert {"outputs/model.txt", "outputs/sub/extra.txt", "logs/train.log"} <= set(names)
    saved = run.download_file("outputs/model.txt", str(tmp_path / "m.txt"))
    assert Path(saved).read_text() == "model\n"
    run.download_files(prefix="outputs", output_directory=str(tmp_path / "kept"))
    assert (tmp_path / "kept" / "outputs" / "sub" / "extra.txt").read_text() == "x"
    run.download_files(prefix="outputs/", output_directory=str(tmp_path / "flat"),
                       append_prefix=False)
    assert (tmp_path / "flat" / "model.txt").is_file()
    logs = run.get_details_with_logs()["logFiles"]
    assert any("args" in text for text in logs.values())

    assert Run.get(ws, run.id).get_status() == "Completed"
    assert next(iter(experiment.get_runs())).id == run.id
    assert "aml-exp" in ws.experiments
    RunDetails(run).show(refresh_seconds=0.2)
    shown = capsys.readouterr().out
    assert "Completed" in shown and "accuracy" in shown and "rank0" in shown


def test_script_run_config_metrics_from_four_ranks(ws: Workspace, target: AmlCompute,
                                                   tmp_path: Path) -> None:
    src = source(tmp_path / "ranks", {"ranks.py": """\
        import os
        from batchyard.compat.azureml.core.run import Run
        run = Run.get_context()
        run.log("rank", int(os.environ["RANK"]))
        run.log("world", int(os.environ["WORLD_SIZE"]), step=int(os.environ["RANK"]))
        assert os.environ["MODE"] == "ranks"
        """})
    env = Environment("ranks-env")
    env.environment_variables = {"MODE": "ranks"}
    config = ScriptRunConfig(source_directory=src, script="ranks.py", compute_target=target,
                             environment=env,
                             distributed_job_config=PyTorchConfiguration(process_count=4,
                                                                         node_count=2))
    run = Experiment(ws, "aml-ranks").submit(config)
    details = run.wait_for_completion()
    assert details["runDefinition"]["nodeCount"] == 2
    assert details["runDefinition"]["processCountPerNode"] == 2
    metrics = run.get_metrics()
    assert sorted(metrics["rank"]) == [0, 1, 2, 3] and metrics["world"] == [4] * 4


def test_failed_run_raises_and_cancel_cancels(ws: Workspace, target: AmlCompute,
                                              tmp_path: Path) -> None:
    src = source(tmp_path / "bad", {"fail.py": "import sys\nprint('about to fail')\n"
                                    "sys.exit(3)\n",
                                    "sleep.py": "import time\ntime.sleep(120)\n"})
    exp = Experiment(ws, "aml-bad")
    failing = exp.submit(Estimator(src, compute_target=target, entry_script="fail.py"))
    with pytest.raises(ActivityFailedException, match="exited with code 3"):
        failing.wait_for_completion()
    details = failing.wait_for_completion(raise_on_error=False)
    assert details["status"] == "Failed" and details["properties"]["batchyard.exitCode"] == "3"
    error = details["error"]["error"]  # the cause, as AML's inner error code
    assert error["innerError"] == {"code": "ExecutionFailed"}, error
    assert error["message"].endswith("(user code error): about to fail"), error
    sleeping = exp.submit(Estimator(src, compute_target=target, entry_script="sleep.py"))
    sleeping.cancel()
    assert sleeping.wait_for_completion(raise_on_error=False)["status"] == "Canceled"


def test_pip_packages_are_installed_for_the_job_only(ws: Workspace, target: AmlCompute,
                                                     tmp_path: Path) -> None:
    # a small pure-Python package that batchyard's own interpreter does not have
    package = next((p for p in ("tabulate", "termcolor", "toolz", "six", "colorama")
                    if importlib.util.find_spec(p) is None), None)
    if package is None:
        pytest.skip("every candidate package is already installed here")
    src = source(tmp_path / "pip", {"uses_it.py": f"""\
        import {package}
        print("found in", {package}.__file__, flush=True)
        assert "pip-packages" in {package}.__file__
        """})
    run = Experiment(ws, "aml-pip").submit(
        Estimator(src, compute_target=target, entry_script="uses_it.py",
                  pip_packages=[package]))
    details = run.wait_for_completion(raise_on_error=False)
    logs = "".join(run.job.logs())
    if details["status"] == "Failed" and "pip install" in logs and "found in" not in logs:
        pytest.skip("pip could not reach a package index from here")
    assert details["status"] == "Completed", logs
    assert f"pip_packages: installing {package}" in logs
    assert importlib.util.find_spec(package) is None  # batchyard's interpreter untouched


def test_default_datastore_as_mount(ws: Workspace, target: AmlCompute, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "digits.csv").write_text("1,2,3\n")
    store = ws.get_default_datastore()
    store.upload(src_dir=str(data), target_path="digits", overwrite=True, show_progress=False)
    src = source(tmp_path / "ds", {"read.py": """\
        import os, sys
        path = sys.argv[sys.argv.index("--data") + 1]
        assert os.environ["AZUREML_DATAREFERENCE_workspaceblobstore"] == path
        print("read", open(os.path.join(path, "digits.csv")).read().strip(), flush=True)
        """})
    est = Estimator(src, compute_target=target, entry_script="read.py",
                    script_params={"--data": store.path("digits").as_mount()})
    run = Experiment(ws, "aml-data").submit(est)
    assert run.wait_for_completion()["status"] == "Completed"
    assert "read 1,2,3" in "".join(run.job.logs())
    out = tmp_path / "back"
    assert store.download(str(out), prefix="digits", show_progress=False) == 1
    assert (out / "digits" / "digits.csv").read_text() == "1,2,3\n"


def test_offline_context_outside_a_job(env: Any, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Run, "_context", None)
    run = Run.get_context()
    assert run.id.startswith("OfflineRun_")
    run.log("offline_metric", 1.5)
    assert "Attempted to log scalar metric offline_metric" in capsys.readouterr().out
    assert run.get_metrics("offline_metric") == {"offline_metric": 1.5}
    run.tag("t", "v")
    assert run.get_tags() == {"t": "v"}
    monkeypatch.setattr(Run, "_context", None)
    from batchyard.compat.azureml.exceptions import RunEnvironmentException

    with pytest.raises(RunEnvironmentException):
        Run.get_context(allow_offline=False)


SLOW = """\
    import time
    from batchyard.compat.azureml.core.run import Run
    run = Run.get_context()
    for i in range(8):
        print("tick", i, flush=True)
        run.log("tick", i)
        time.sleep(0.5)
    """
SHOW = f"""\
import sys
from batchyard.compat.azureml.core.run import Run
from batchyard.compat.azureml.core.workspace import Workspace
from batchyard.compat.azureml.widgets import RunDetails
ws = Workspace.get({WS!r}, subscription_id={SUB!r}, resource_group={RG!r})
RunDetails(Run.get(ws, sys.argv[1])).show(refresh_seconds=0.3)
print("SHOWN", flush=True)
"""


def _in_a_terminal(argv: list[str], env: dict[str, str], timeout: float = 120) -> bytes:
    """What ``argv`` writes to a real terminal (a pty) until it exits."""
    import os
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    seen, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(fd, 65536)
                except OSError:  # EIO: it has exited
                    break
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
    finally:
        os.close(fd)
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    return seen


def test_run_details_is_live_in_a_terminal_and_one_table_in_a_pipe(
        ws: Workspace, target: AmlCompute, env: Any, tmp_path: Path) -> None:
    """Issue 33 #20: `RunDetails(run).show()` in a terminal redraws while the run goes (as
    AML's widget updated), and prints one final table where it cannot redraw."""
    import os
    import subprocess
    import sys

    src = source(tmp_path / "slow", {"train.py": SLOW})
    show = tmp_path / "show.py"
    show.write_text(SHOW)
    environ = {**env.env, "TERM": "xterm", "COLUMNS": "120"}
    environ.pop("NO_COLOR", None)
    config = ScriptRunConfig(source_directory=src, script="train.py", compute_target=target)
    run = Experiment(ws, name="live-details").submit(config)
    seen = _in_a_terminal([sys.executable, str(show), run.id], environ).decode(errors="replace")
    assert "SHOWN" in seen, seen[-2000:]
    assert seen.count("Status") >= 3, seen[-2000:]  # redrawn, not printed once at the end
    assert seen.index("Running") < seen.rindex("Completed"), seen[-2000:]
    assert "tick" in seen and "Traceback" not in seen

    again = Experiment(ws, name="live-details").submit(config)
    piped = subprocess.run([sys.executable, str(show), again.id], env=environ,
                           capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.count("Status") == 1 and "Completed" in piped.stdout, piped.stdout
    assert "\x1b" not in piped.stdout and "Running" not in piped.stdout
    assert os.environ.get("BATCHYARD_HOME") == str(env.home)
