"""The example scripts' own logic (env-contract checks, TF_CONFIG checks, the numpy MLP) and
that every example job file still reads as a valid job. No ranks are started here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

import strictkit
from batchyard.spec.loader import load_job_file

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def load(relative: str) -> ModuleType:
    path = EXAMPLES / relative
    name = "example_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


hello = load("hello-distributed/hello.py")
tfc = load("tf-config/show_tf_config.py")


def contract(node: int, local: int, nodes: int = 2, ppn: int = 2) -> dict[str, str | None]:
    """What batchyard promises rank (node, local) of a nodes x ppn pytorch gang (DESIGN §4)."""
    ips = [f"10.0.0.{4 + i}" for i in range(nodes)]
    rank = node * ppn + local
    view: dict[str, str | None] = {name: None for name in hello.SHOWN}
    view.update({
        "RANK": str(rank), "WORLD_SIZE": str(nodes * ppn), "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(ppn), "GROUP_RANK": str(node), "NODE_RANK": str(node),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nodes * ppn),
        "MASTER_ADDR": ips[0], "MASTER_PORT": "29500",
        "BATCHYARD_NODE_RANK": str(node), "BATCHYARD_NUM_NODES": str(nodes),
        "BATCHYARD_PROCESSES_PER_NODE": str(ppn), "BATCHYARD_NODE_IPS": "\n".join(ips),
        "AZ_BATCH_MASTER_NODE": f"{ips[0]}:29500", "AZ_BATCHAI_TASK_INDEX": str(node),
    })
    return view


@pytest.mark.parametrize(("node", "local"), [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_hello_accepts_the_contract(node: int, local: int) -> None:
    assert hello.check(contract(node, local), allow_missing=False) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"RANK": "2"}, "NODE_RANK*LOCAL_WORLD_SIZE+LOCAL_RANK"),
        ({"WORLD_SIZE": "6"}, "BATCHYARD_NUM_NODES*LOCAL_WORLD_SIZE"),
        ({"GROUP_RANK": "0"}, "GROUP_RANK=0 != NODE_RANK=1"),
        ({"MASTER_ADDR": "10.0.0.5"}, "first line of BATCHYARD_NODE_IPS"),
        ({"AZ_BATCH_MASTER_NODE": "10.0.0.4:1"}, "AZ_BATCH_MASTER_NODE"),
        ({"AZ_BATCHAI_TASK_INDEX": "0"}, "AZ_BATCHAI_TASK_INDEX=0 != NODE_RANK=1"),
        ({"BATCHYARD_NODE_RANK": "0"}, "BATCHYARD_NODE_RANK=0 != NODE_RANK=1"),
        ({"BATCHYARD_NODE_IPS": "10.0.0.4"}, "has 1 lines"),
        ({"RANK": "x"}, "not an integer"),
        ({"MASTER_PORT": None}, "MASTER_PORT is not set"),
    ],
)
def test_hello_names_each_mismatch(change: dict[str, str | None], expected: str) -> None:
    view = contract(1, 1) | change
    errors = hello.check(view, allow_missing=False)
    assert any(expected in e for e in errors), errors


def test_hello_allow_missing_fits_bare_torchrun() -> None:
    view = {name: None for name in hello.SHOWN} | {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
    }
    assert hello.check(view, allow_missing=True) == []
    assert hello.check(view, allow_missing=False)


def test_hello_rendezvous_file_and_summary_leave_out_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in contract(0, 0).items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("BATCHYARD_JOB_TOKEN", "do-not-leak")
    monkeypatch.setenv("BATCHYARD_OUTPUT_RESULT", str(tmp_path / "result"))
    assert hello.main(["--rendezvous", str(tmp_path / "rdv")]) == 0
    record = json.loads((tmp_path / "rdv" / "rank-0.json").read_text())
    assert record["ok"] and record["rank"] == 0 and record["node_ips"] == ["10.0.0.4", "10.0.0.5"]
    assert isinstance(record["started_at"], float)
    assert "do-not-leak" not in (tmp_path / "rdv" / "rank-0.json").read_text()
    summary = json.loads((tmp_path / "result" / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["master"] == "10.0.0.4:29500"
    assert "env contract OK" in capsys.readouterr().out

    monkeypatch.setenv("RANK", "3")
    assert hello.main([]) == 1
    assert "environment contract violated" in capsys.readouterr().err


CLUSTER = {"chief": ["h0:2222"], "worker": ["h0:2223", "h1:2222"], "ps": ["h1:2223"]}
WORKERS = ["h0:2222", "h0:2223", "h1:2222"]


@pytest.mark.parametrize(
    "task",
    [{"type": "chief", "index": 0}, {"type": "worker", "index": 1}, {"type": "ps", "index": 0}],
)
def test_tf_config_accepts_a_consistent_cluster(task: dict[str, object]) -> None:
    assert tfc.check_tf_config({"cluster": CLUSTER, "task": task}) == []


@pytest.mark.parametrize(
    ("tf_config", "expected"),
    [
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": 2}}, "out of range"),
        ({"cluster": CLUSTER, "task": {"type": "evaluator", "index": 0}}, "not in the cluster"),
        ({"cluster": {"master": ["a:1"]}, "task": {"type": "master", "index": 0}}, "'chief'"),
        ({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}},
         "more than once"),
        ({"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}, "host:port"),
        ({"task": {"type": "worker", "index": 0}}, "cluster is missing"),
    ],
)
def test_tf_config_names_each_problem(tf_config: dict[str, object], expected: str) -> None:
    errors = tfc.check_tf_config(tf_config)
    assert any(expected in e for e in errors), errors


def test_batchai_master_is_worker_zero_and_chief() -> None:
    assert tfc.tf_task("worker", 0, has_chief=True) == ("chief", 0)
    assert tfc.tf_task("worker", 2, has_chief=True) == ("worker", 1)
    assert tfc.tf_task("ps", 0, has_chief=True) == ("ps", 0)
    ok = tfc.check_batchai(CLUSTER, {"type": "worker", "index": 0}, WORKERS, ["h1:2223"],
                           "worker", 1)
    assert ok == []
    # the chief and worker 0 both claiming Batch AI worker index 0 is caught
    clash = tfc.check_batchai(CLUSTER, {"type": "worker", "index": 0}, WORKERS, ["h1:2223"],
                              "worker", 0)
    assert any("TF_CONFIG.task is worker 0" in e for e in clash), clash
    short = tfc.check_batchai(CLUSTER, None, WORKERS[:2], ["h1:2223"], None, None)
    assert any("AZ_BATCHAI_WORKER_HOSTS has 2 hosts" in e for e in short), short


@pytest.mark.parametrize(
    "job_file",
    sorted(
        str(p.relative_to(EXAMPLES))
        for p in EXAMPLES.glob("*/job*.*")
        if p.suffix in (".json", ".yaml", ".yml")
    ),
)
def test_example_job_files_read(job_file: str) -> None:
    spec = load_job_file(EXAMPLES / job_file)
    assert spec.nodes == 2
    assert spec.total_processes in (4, 8)


def test_numpy_mlp_gradient_matches_finite_differences() -> None:
    strictkit.importorskip("mpi4py")
    np = strictkit.importorskip("numpy")
    train_mpi = load("mnist-mpi/train_mpi.py")
    model = train_mpi.MLP(unit=8, seed=1)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(5, 64)), rng.integers(0, 10, size=5)
    model.loss_and_grad(x, y)
    analytic = model.grad.copy()
    for i in rng.choice(model.flat.size, size=25, replace=False):
        saved = model.flat[i]
        model.flat[i] = saved + 1e-5
        up = model.loss_and_grad(x, y)
        model.flat[i] = saved - 1e-5
        down = model.loss_and_grad(x, y)
        model.flat[i] = saved
        assert analytic[i] == pytest.approx((up - down) / 2e-5, abs=1e-6)


def test_bundled_digits_read_directly_match_sklearn() -> None:
    strictkit.importorskip("mpi4py")
    datasets = strictkit.importorskip("sklearn.datasets")
    np = strictkit.importorskip("numpy")
    x, y = load("mnist-mpi/train_mpi.py").load_digits_arrays()
    digits = datasets.load_digits()
    assert np.array_equal(x, digits.data) and np.array_equal(y, digits.target)
