"""What ``python``/``python3``/``pip`` and ``azureml`` are for a job's processes on the host:
the shims job_python_env writes, run for real; the rank shim putting them back first after
mpirun's own PATH change; the azureml alias package; node-wide mount paths."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from batchyard.node.env import job_python_env, node_dirs, node_mount_relative
from batchyard.node.mpi import RANK_SHIM
from batchyard.node.plan import NodePlan
from batchyard.node.pyshim import write_pyshim


def _plan(tmp_path: Path, **env: str) -> NodePlan:
    return NodePlan(job_id=1, job_name="j", workspace="w", experiment="e", attempt=1,
                    attempt_uuid="u" * 32, node_rank=0, node_names=["n0"],
                    node_addrs=["127.0.0.1"], distribution={"type": "mpi"}, command="x",
                    prepare=None, attempt_dir=str(tmp_path / "a"), node_dir=str(tmp_path / "n"),
                    checkpoint_dir=str(tmp_path / "c"), master_addr="127.0.0.1",
                    master_port=29500, env=dict(env))


def _run(command: str, env: dict[str, str]) -> str:
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.strip()


def test_python_python3_pip_are_the_jobs_interpreter(tmp_path: Path) -> None:
    """Even an interpreter named ``python3`` whose directory has no ``python`` (the host's
    /usr/bin) gets both names and ``pip`` from the shims, ahead of anything on PATH."""
    plan = _plan(tmp_path)
    dirs = node_dirs(plan)
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    for name in ("python", "python3", "pip"):
        (decoy / name).write_text("#!/bin/sh\necho decoy\n")
        (decoy / name).chmod(0o755)
    env = job_python_env(plan, dirs, Path(sys.executable), f"{decoy}:/usr/bin:/bin")
    assert env["PATH"].split(":")[:2] == [str(dirs.job_temp / "bin"),
                                          str(Path(sys.executable).parent)]
    shell_env = {"PATH": env["PATH"]}
    for name in ("python", "python3"):
        assert _run(f"{name} -c 'import sys; print(sys.prefix)'", shell_env) == sys.prefix
    assert f" from {sys.prefix}/" in _run("pip --version", shell_env)
    assert env["BATCHYARD_JOB_BIN"] == str(dirs.job_temp / "bin")


def test_rank_shim_puts_the_job_bin_back_first(tmp_path: Path) -> None:
    """Open MPI's mpirun, called by its absolute path, starts remote ranks with its own bin
    first on PATH (as --prefix): the rank shim puts the job's bin back in front."""
    plan = _plan(tmp_path)
    dirs = node_dirs(plan)
    env = job_python_env(plan, dirs, Path(sys.executable), "/usr/bin:/bin")
    stdouterr = tmp_path / "logs"
    stdouterr.mkdir()
    rank_env = {"PATH": f"/usr/bin:{env['PATH']}", "BATCHYARD_JOB_BIN": env["BATCHYARD_JOB_BIN"],
                "AZ_BATCHAI_STDOUTERR_DIR": str(stdouterr), "BATCHYARD_NODE_NAME": "n1",
                "BATCHYARD_JOB_DIR": str(tmp_path / "a"), "OMPI_COMM_WORLD_RANK": "2"}
    subprocess.run(["bash", "-c", RANK_SHIM, "batchyard-mpi-rank", "command -v python3"],
                   env=rank_env, check=True, timeout=60)
    assert (stdouterr / "n1-rank2.stdout.txt").read_text().strip() == \
        str(dirs.job_temp / "bin" / "python3")


def test_pyshim_first_on_pythonpath_keeps_the_users(tmp_path: Path) -> None:
    plan = _plan(tmp_path, PYTHONPATH="/opt/mine")
    env = job_python_env(plan, node_dirs(plan), Path(sys.executable), "/usr/bin")
    shim, user = env["PYTHONPATH"].split(os.pathsep)
    assert user == "/opt/mine" and (Path(shim) / "azureml" / "__init__.py").is_file()


def test_azureml_names_are_the_compat_modules(tmp_path: Path) -> None:
    """``azureml.X`` and ``batchyard.compat.azureml.X`` are the same module objects."""
    shim = write_pyshim(tmp_path / "pyshim")
    code = ("import sys\n"
            "from azureml.core.run import Run\n"
            "from azureml.core import Run as CoreRun, Workspace\n"
            "import azureml.core.run, azureml.telemetry\n"
            "import batchyard.compat.azureml.core.run as real\n"
            "assert Run is CoreRun is real.Run\n"
            "assert sys.modules['azureml.core.run'] is real\n"
            "assert azureml.core.run is real\n"
            "assert Workspace.__module__ == 'batchyard.compat.azureml.core.workspace'\n"
            "try:\n    import azureml.nosuch\nexcept ModuleNotFoundError as e:\n"
            "    print('missing', e.name)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(shim)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "missing azureml.nosuch"


def test_node_mount_relative_is_under_the_node_mount_root(tmp_path: Path) -> None:
    dirs = node_dirs(_plan(tmp_path))
    assert (dirs.job_mount_root / node_mount_relative("autobfs")).resolve() == \
        (dirs.mount_root / "autobfs").resolve()
