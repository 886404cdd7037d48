"""JobSpec builders and the per-job pip_packages step (validation, the already-installed
shortcut), without a server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batchyard.errors import SpecError
from batchyard.sdk import command_job, mpi_job, pip, python_job, pytorch_job, tensorflow_job


def test_pytorch_job_builds_a_valid_spec() -> None:
    spec = pytorch_job("train.py", ["--epochs", 3], nodes=2, processes_per_node=2,
                       code="examples/mnist-ddp", outputs=["MODEL"], env={"A": "1"},
                       max_wall_clock="10m", tags={"team": "x"})
    assert spec.command == ["python", "train.py", "--epochs", "3"]
    assert spec.nodes == 2 and spec.distribution.type == "pytorch"
    assert spec.distribution.processes_per_node == 2 and spec.total_processes == 4
    assert set(spec.outputs) == {"MODEL"} and spec.env == {"A": "1"}
    assert spec.limits.max_wall_clock == 600 and spec.tags == {"team": "x"}


def test_mpi_tensorflow_and_command_jobs() -> None:
    mpi = mpi_job("train_mpi.py", nodes=2, processes_per_node=4, process_count=6)
    assert mpi.distribution.type == "mpi" and mpi.total_processes == 6
    tf = tensorflow_job("tf.py", nodes=2, processes_per_node=2, parameter_server_count=1)
    assert tf.distribution.type == "tensorflow" and tf.distribution.parameter_server_count == 1
    custom = command_job("echo hi", distribution="custom", prepare=["pip", "list"])
    assert custom.total_processes == 1 and custom.prepare == "pip list"
    assert python_job("x.py").distribution.type == "pytorch"


def test_pip_packages_become_a_prepare_step_and_a_pythonpath() -> None:
    spec = python_job("x.py", pip_packages=["six", "numpy>=1.20"], prepare="echo first")
    assert spec.prepare == "echo first && python -m batchyard.sdk.pip six 'numpy>=1.20'"
    assert isinstance(spec.command, str)
    assert spec.command.startswith('export PYTHONPATH="$AZ_BATCHAI_JOB_TEMP/pip-packages')
    assert spec.command.endswith("; python x.py")


@pytest.mark.parametrize("req", ["numpy", "torch>=2.1", "scikit-learn==1.5.0",
                                 "pkg[extra]>=1,<2", "a.b_c-d~=1.0"])
def test_plain_requirements_are_accepted(req: str) -> None:
    assert pip.check_requirements([req]) == [req]


@pytest.mark.parametrize("req", ["--index-url=http://evil", "-e .", "./local/dir",
                                 "git+https://github.com/x/y", "pkg; rm -rf /", ""])
def test_options_urls_and_paths_are_refused_naming_the_field(req: str) -> None:
    with pytest.raises(SpecError, match=r"pip_packages\[0\]"):
        pip.check_requirements([req])


def test_satisfied_requirements_are_not_installed_again(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert pip._satisfied("numpy") and pip._satisfied("numpy>=1.0")
    assert not pip._satisfied("numpy<0.1")
    assert not pip._satisfied("batchyard-no-such-package-xyz")
    monkeypatch.setenv("AZ_BATCHAI_JOB_TEMP", str(tmp_path))
    assert pip.main(["numpy", "pyyaml"]) == 0
    assert "already installed" in capsys.readouterr().out
    assert (tmp_path / "pip-packages").is_dir()


def test_pip_step_outside_a_job_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZ_BATCHAI_JOB_TEMP", raising=False)
    assert pip.main(["numpy"]) == 2
    assert "AZ_BATCHAI_JOB_TEMP" not in os.environ
