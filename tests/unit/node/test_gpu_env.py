"""GPU paths of the env contract and the local backend's node slices, checked without a GPU
(no GPU machine was available to run them for real)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchyard.backends.local import LocalBackend, host_gpus
from batchyard.node.env import node_dirs, node_env, rank_env
from batchyard.node.plan import NodePlan


def _plan(tmp_path: Path, gpus: list[int] | None, ppn: int = 2, backend: str = "auto",
          node_rank: int = 0) -> NodePlan:
    return NodePlan(job_id=1, job_name="j", workspace="w", experiment="e", attempt=1,
                    attempt_uuid="u", node_rank=node_rank, node_names=["n0", "n1"],
                    node_addrs=["10.0.0.4", "10.0.0.5"],
                    distribution={"type": "pytorch", "processes_per_node": ppn,
                                  "backend": backend},
                    command="python train.py", prepare=None, attempt_dir=str(tmp_path / "a"),
                    node_dir=str(tmp_path / "n"), checkpoint_dir=str(tmp_path / "c"),
                    master_addr="10.0.0.4", master_port=29500, gpus=gpus, cpus=12)


def test_one_gpu_per_local_rank(tmp_path: Path) -> None:
    plan = _plan(tmp_path, gpus=[2, 3])
    base = node_env(plan, node_dirs(plan))
    assert base["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert base["AZ_BATCHAI_NUM_GPUS"] == "2"
    assert base["BATCHYARD_DIST_BACKEND"] == "nccl"
    assert [rank_env(plan, base, r)["CUDA_VISIBLE_DEVICES"] for r in (0, 1)] == ["2", "3"]


def test_several_gpus_per_rank_and_fewer_gpus_than_ranks(tmp_path: Path) -> None:
    plan = _plan(tmp_path, gpus=[0, 1, 2, 3])
    base = node_env(plan, node_dirs(plan))
    assert [rank_env(plan, base, r)["CUDA_VISIBLE_DEVICES"] for r in (0, 1)] == ["0,1", "2,3"]
    shared = _plan(tmp_path, gpus=[0], ppn=2)
    base = node_env(shared, node_dirs(shared))
    # one GPU for two ranks: both see it (the script picks cuda:LOCAL_RANK % count)
    assert [rank_env(shared, base, r)["CUDA_VISIBLE_DEVICES"] for r in (0, 1)] == ["0", "0"]


def test_cpu_nodes_get_gloo_and_no_devices(tmp_path: Path) -> None:
    plan = _plan(tmp_path, gpus=None)
    base = node_env(plan, node_dirs(plan))
    assert base["BATCHYARD_DIST_BACKEND"] == "gloo"
    assert base["AZ_BATCHAI_NUM_GPUS"] == "0"
    assert "CUDA_VISIBLE_DEVICES" not in base
    forced = _plan(tmp_path, gpus=[0, 1], backend="gloo")
    assert node_env(forced, node_dirs(forced))["BATCHYARD_DIST_BACKEND"] == "gloo"


def test_local_nodes_slice_the_host_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    monkeypatch.setenv("BATCHYARD_HOME", str(tmp_path))
    monkeypatch.setenv("BATCHYARD_GPU_CLAIMS", str(tmp_path / "claims"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert host_gpus() == [0, 1, 2, 3]
    backend = LocalBackend()
    size = {"vcpus": 12, "gpus": 2, "family": "standardNCFamily"}
    slices = [backend.provision_node("gpu", "w", i, size).resources["gpu_ids"] for i in range(2)]
    assert slices == [[0, 1], [2, 3]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    none = backend.provision_node("gpu", "w", 0, size).resources
    assert none["gpus"] == 0 and none["declared_gpus"] == 2


def test_every_rank_counts_gpus_in_pci_bus_order(tmp_path: Path) -> None:
    for gpus in ([0, 1], None, ["GPU-8a3c6f1e", "MIG-5c2f4e3d-2b1a-5f0e-9d8c-7b6a5f4e3d2c"]):
        plan = _plan(tmp_path, gpus=gpus)  # type: ignore[arg-type]
        base = node_env(plan, node_dirs(plan))
        assert rank_env(plan, base, 0)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert base["CUDA_VISIBLE_DEVICES"] == "GPU-8a3c6f1e,MIG-5c2f4e3d-2b1a-5f0e-9d8c-7b6a5f4e3d2c"
    assert rank_env(plan, base, 1)["CUDA_VISIBLE_DEVICES"] == \
        "MIG-5c2f4e3d-2b1a-5f0e-9d8c-7b6a5f4e3d2c"
    own = _plan(tmp_path, gpus=[0])
    own.env = {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}  # the job's own choice stays
    assert node_env(own, node_dirs(own))["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_batch_ai_path_variables_expand_in_every_path(tmp_path: Path) -> None:
    from batchyard.node.env import expand_plan_paths

    plan = _plan(tmp_path, gpus=None)
    plan.stdouterr_path_prefix = "$AZ_BATCHAI_JOB_TEMP"
    plan.outputs = {"MODEL": {"path_prefix": "${AZ_BATCHAI_SHARED_JOB_TEMP}/out",
                              "path_suffix": "models"}}
    plan.python = "$AZ_BATCHAI_JOB_MOUNT_ROOT/venv/bin/python"
    dirs = node_dirs(plan)
    env = node_env(plan, dirs)
    assert str(dirs.stdouterr) == f"{env['AZ_BATCHAI_JOB_TEMP']}/w/e/j/u/stdouterr"
    assert str(dirs.outputs["MODEL"]).startswith(f"{env['AZ_BATCHAI_SHARED_JOB_TEMP']}/out/")
    assert "$" not in str(dirs.outputs["MODEL"])
    expand_plan_paths(plan)
    assert plan.python == f"{env['AZ_BATCHAI_JOB_MOUNT_ROOT']}/venv/bin/python"
