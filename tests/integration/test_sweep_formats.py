"""The DDP sweep of ``examples/sweep-ddp`` through the other two formats, smaller (4 trials,
2 at a time, on the 2-node local cluster): the AML v1 compat (`HyperDriveConfig` with
`RandomParameterSampling`, `BanditPolicy`, `PrimaryMetricGoal.MAXIMIZE`, submitted with
`experiment.submit`, read back with `get_children`, `get_best_run_by_primary_metric`,
`get_metrics`) and the AML v2 `type: sweep` YAML through `batchyard sweep create`."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchyard.sdk import set_default_client
from yardkit import Yard, wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.torch, pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sweep-ddp"


@pytest.fixture(scope="module")
def env(yard: Yard) -> Iterator[Yard]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BATCHYARD_HOME", str(yard.home))
        for key in ("BATCHYARD_SERVER", "BATCHYARD_TOKEN", "BATCHYARD_API",
                    "BATCHYARD_DATA_ROOT"):
            mp.delenv(key, raising=False)
        set_default_client(None)
        yield yard
        set_default_client(None)


def test_hyperdrive_config_through_the_aml_v1_compat(env: Yard, cluster2: str,
                                                     tmp_path: Path) -> None:
    from batchyard.compat.azureml.core import Experiment, ScriptRunConfig, Workspace
    from batchyard.compat.azureml.core.compute import ComputeTarget
    from batchyard.compat.azureml.core.runconfig import PyTorchConfiguration
    from batchyard.compat.azureml.train.hyperdrive import (
        BanditPolicy,
        HyperDriveConfig,
        PrimaryMetricGoal,
        RandomParameterSampling,
        choice,
        loguniform,
    )

    source = tmp_path / "src"
    shutil.copytree(EXAMPLE, source)
    ws = Workspace.get("default")
    target = ComputeTarget(workspace=ws, name=cluster2)
    src = ScriptRunConfig(source_directory=str(source), script="train.py",
                          arguments=["--epochs", 5, "--epoch-seconds", 0.5],
                          compute_target=target,
                          distributed_job_config=PyTorchConfiguration(
                              communication_backend="Gloo", node_count=2))
    sampling = RandomParameterSampling({"--lr": loguniform(-12, -1),
                                        "--momentum": choice(0.8, 0.9)},
                                       properties={"seed": 1})
    config = HyperDriveConfig(run_config=src, hyperparameter_sampling=sampling,
                              policy=BanditPolicy(evaluation_interval=1, slack_factor=0.25,
                                                  delay_evaluation=2),
                              primary_metric_name="val_accuracy",
                              primary_metric_goal=PrimaryMetricGoal.MAXIMIZE,
                              max_total_runs=4, max_concurrent_runs=2)
    run = Experiment(ws, "hyperdrive").submit(config)
    assert run.id.startswith("HD_")
    details = run.wait_for_completion(show_output=False)
    assert details["status"] == "Completed", details
    children = run.get_children()
    assert len(children) == 4 and all(c.id.startswith(run.id + "_") for c in children)
    for child in children:
        job = child.job.refresh()
        assert job["nodes"] == 2 and job["processes_per_node"] == 1
        args = job["spec"]["command"]
        assert "--lr" in args and "--momentum" in args, args  # appended as HyperDrive did
        hp = json.loads(child.get_tags()["hyperparameters"])
        assert set(hp) == {"--lr", "--momentum"}
    metrics = run.get_metrics()
    assert set(metrics) == {c.id for c in children}
    best = run.get_best_run_by_primary_metric()
    assert best is not None
    finals = {rid: m["val_accuracy"][-1] if isinstance(m["val_accuracy"], list)
              else m["val_accuracy"] for rid, m in metrics.items() if "val_accuracy" in m}
    finished = {c.id for c in children if c.get_status() == "Completed"}
    assert best.id == max((r for r in finals if r in finished), key=lambda r: finals[r])
    ranked = run.get_children_sorted_by_primary_metric()
    assert ranked[0]["run_id"] == best.id
    assert Experiment(ws, "hyperdrive").submit(config).id != run.id  # a fresh sweep each time
    # cancel(): the second one stops making trials and ends canceled
    second = [s for s in env.js("sweep", "list", "-e", "hyperdrive") if s["name"] != run.id]
    from batchyard.compat.azureml.train.hyperdrive import HyperDriveRun

    other = HyperDriveRun(Experiment(ws, "hyperdrive"), second[0]["name"])
    other.cancel()
    wait_until(lambda: other.get_status() == "Canceled", 60, 0.5, "the sweep to cancel")
    assert all(c.get_status() in ("Canceled", "Completed", "Failed")
               for c in other.get_children())


def test_aml_v2_sweep_yaml(env: Yard, cluster2: str) -> None:
    folder = env.work / "sweep-ddp-aml"
    shutil.copytree(EXAMPLE, folder, dirs_exist_ok=True)
    made = env.js("sweep", "create", "-f", str(folder / "sweep-aml.yml"))
    assert made["name"] == "lr-sweep-aml" and made["experiment"] == "sweep-ddp"
    assert made["cluster"] == cluster2 and made["source_format"] == "aml"
    done = env.js("sweep", "wait", "lr-sweep-aml", "-e", "sweep-ddp", "--timeout", "240")
    assert done["state"] == "succeeded", done
    trials: list[dict[str, Any]] = done["trials"]
    assert sorted(t["index"] for t in trials) == [0, 1, 2, 3]
    for t in trials:
        job = env.job(t["name"], experiment="sweep-ddp")
        assert job["source_format"] == "aml" and job["nodes"] == 2
        assert f"--lr {t['params']['lr']!r}" in job["spec"]["command"], job["spec"]["command"]
        assert "${{" not in job["spec"]["command"]
    assert done["best"]["objective"] == max(t["objective"] for t in trials
                                            if t["state"] == "succeeded")
