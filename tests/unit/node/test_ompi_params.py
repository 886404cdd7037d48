"""Open MPI's mpirun line and environment, offline: no btl list is forced (it broke MPI
one-sided windows), a multi-node gang gets UCX's one-sided path, the job's ``mpi.mca``
overrides batchyard's value of a parameter (given once: Open MPI joins repeated values), and
each node's daemon on a shared machine gets its own shared-memory directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchyard.node import ompi
from batchyard.node.mpi import mpirun_argv
from batchyard.node.plan import NodePlan


def _plan(tmp_path: Path, addrs: tuple[str, ...] = ("127.0.0.1", "127.0.0.1"),
          **changes: Any) -> NodePlan:
    plan = NodePlan(job_id=1, job_name="j", workspace="w", experiment="e", attempt=1,
                    attempt_uuid="u" * 32, node_rank=0,
                    node_names=[f"n-{i}" for i in range(len(addrs))], node_addrs=list(addrs),
                    distribution={"type": "mpi", "processes_per_node": 2},
                    command="python x.py", prepare=None, attempt_dir=str(tmp_path / "a"),
                    node_dir=str(tmp_path / "n"), checkpoint_dir=str(tmp_path / "c"),
                    master_addr=addrs[0], master_port=29500, rsh_agent=["/agent"], cpus=64)
    for key, value in changes.items():
        setattr(plan, key, value)
    return plan


def _mca(argv: list[str]) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--mca"]


def test_no_btl_list_and_one_sided_across_nodes(tmp_path: Path) -> None:
    plan = _plan(tmp_path, ("10.0.0.1", "10.0.0.2"), subnet="10.0.0.0/24", ifname="eth1")
    params = dict(_mca(mpirun_argv(plan, mpirun="mpirun")))
    assert "btl" not in params
    assert params["btl_tcp_if_include"] == params["oob_tcp_if_include"] == "10.0.0.0/24"
    assert {k: params[k] for k in ompi.ONE_SIDED} == ompi.ONE_SIDED
    env = ompi.mca_env(plan)
    assert env["OMPI_MCA_pml"] == env["OMPI_MCA_osc"] == ""
    assert env["UCX_NET_DEVICES"] == "eth1" and "UCX_TLS" not in env


def test_one_node_keeps_open_mpis_defaults(tmp_path: Path) -> None:
    plan = _plan(tmp_path, ("127.0.0.1",))
    params = dict(_mca(mpirun_argv(plan, mpirun="mpirun")))
    assert not set(ompi.ONE_SIDED) & set(params)
    assert not [k for k in ompi.mca_env(plan) if k.startswith("UCX_")]


def test_the_jobs_mca_wins_once_and_extra_args_follow(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan.distribution.update({"mpi_mca": {"btl_tcp_if_include": "eth0", "btl": "^openib"},
                              "mpi_extra_args": ["--report-bindings"]})
    argv = mpirun_argv(plan, mpirun="mpirun")
    pairs = _mca(argv)
    assert [v for k, v in pairs if k == "btl_tcp_if_include"] == ["eth0"]
    assert ("btl", "^openib") in pairs
    assert argv[argv.index("--report-bindings") + 1:][:2] == ["bash", "-c"]
    env = ompi.mca_env(plan)
    assert env["OMPI_MCA_btl"] == "^openib" and env["OMPI_MCA_btl_tcp_if_include"] == "eth0"
    plan.env = {"OMPI_MCA_btl": "self,tcp"}  # the job's own variable is left alone
    assert "OMPI_MCA_btl" not in ompi.mca_env(plan)


def test_each_daemon_of_a_shared_machine_has_its_own_shm_dir(tmp_path: Path) -> None:
    base = tmp_path / "base"
    env = ompi.node_mca_env(_plan(tmp_path, node_rank=1), base)
    assert env == {"OMPI_MCA_orte_tmpdir_base": str(base),
                   "OMPI_MCA_btl_vader_backing_directory": str(base),
                   "OMPI_MCA_osc_rdma_backing_directory": str(base)}
    assert ompi.node_mca_env(_plan(tmp_path, ("10.0.0.1", "10.0.0.2")), base) == {}
    boxed = _plan(tmp_path, container={"image": "img"})
    assert ompi.node_mca_env(boxed, base) == {}
    own = _plan(tmp_path, env={"OMPI_MCA_orte_tmpdir_base": "/x"})
    assert "OMPI_MCA_orte_tmpdir_base" not in ompi.node_mca_env(own, base)
    assert ompi.mca_env(_plan(tmp_path, container={"image": "i"}))["UCX_TLS"] == "self,tcp"
