"""The job's ``mpi`` block (Open MPI MCA parameters and more mpirun arguments, the escape
hatch for what batchyard's mpirun line does not say) and the path properties that may start
with one of Batch AI's path variables: what is taken, and what is refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from batchyard.backends.plans import preflight_of
from batchyard.spec.errors import spec_error_from
from batchyard.spec.job import JobSpec

MPI = {"type": "mpi", "processes_per_node": 2}


def _refused(spec: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate({"command": "true", **spec})
    return spec_error_from(info.value, "job").message


def test_the_escape_hatch_is_taken() -> None:
    spec = JobSpec.model_validate({"command": "python x.py", "distribution": MPI,
                                   "mpi": {"mca": {"btl_tcp_eager_limit": 65536,
                                                   "osc": "^ucx", "mpi_show_mca_params": True},
                                           "extra_args": ["--report-bindings", "-x", "FOO"]}})
    assert spec.mpi.mca == {"btl_tcp_eager_limit": "65536", "osc": "^ucx",
                            "mpi_show_mca_params": "True"}
    assert spec.mpi.extra_args == ["--report-bindings", "-x", "FOO"]
    custom = JobSpec.model_validate({"command": "mpirun -np 4 x", "mpi": {"mca": {"btl": "tcp"}},
                                     "distribution": {"type": "custom"}})
    assert custom.mpi.mca == {"btl": "tcp"}  # a custom job's own mpirun gets OMPI_MCA_btl


@pytest.mark.parametrize("spec,field,words", [
    ({"distribution": MPI, "mpi": {"mca": {"Btl": "tcp"}}}, "mpi.mca",
     "'Btl' is not an MCA parameter name"),
    ({"distribution": MPI, "mpi": {"mca": {"plm_rsh_agent": "ssh"}}}, "mpi.mca",
     "relay starts the MPI daemons"),
    ({"distribution": MPI, "mpi": {"mca": {"btl": ["self", "tcp"]}}}, "mpi.mca",
     "give a string, not a list"),
    ({"distribution": MPI, "mpi": {"mca": {"btl": "a\nb"}}}, "mpi.mca", "one line"),
    ({"distribution": MPI, "mpi": {"flavour": "mpich", "mca": {"btl": "tcp"}}}, "mpi",
     "MCA parameters are Open MPI's"),
    ({"distribution": MPI, "mpi": {"extra_args": ["-np", "8"]}}, "mpi.extra_args",
     "[0] '-np': batchyard sets the process count"),
    ({"distribution": MPI, "mpi": {"extra_args": ["--bind-to", "core", "--hostfile=/h"]}},
     "mpi.extra_args", "[2] '--hostfile=/h'"),
    ({"distribution": MPI, "mpi": {"extra_args": [""]}}, "mpi.extra_args", "empty argument"),
    ({"mpi": {"extra_args": ["--report-bindings"]}}, "mpi.extra_args", "applies to mpi jobs"),
    ({"mpi": {"mca": {"btl": "tcp"}}}, "mpi.mca", "applies to mpi jobs"),
    ({"mpi": {"mcaa": {}}}, "mpi.mcaa", "unknown field"),
])
def test_a_bad_mpi_block_names_the_field(spec: dict[str, Any], field: str, words: str
                                         ) -> None:
    message = _refused(spec)
    assert f"{field}" in message and words in message, message


def test_paths_start_with_batch_ais_variables_only() -> None:
    ok = JobSpec.model_validate({"command": "true", "stdouterr_path_prefix": "$AZ_BATCHAI_JOB_TEMP",
                                 "outputs": {"MODEL": "${AZ_BATCHAI_JOB_TEMP}/out",
                                             "LOGS": "/abs/logs", "REL": "rel/dir"}})
    assert ok.stdouterr_path_prefix == "$AZ_BATCHAI_JOB_TEMP"
    message = _refused({"stdouterr_path_prefix": "$HOME/logs"})
    assert "stdouterr_path_prefix" in message and "$AZ_BATCHAI_JOB_TEMP" in message, message
    message = _refused({"outputs": {"MODEL": "$AZ_BATCHAI_JOB_TMP/out"}})
    assert "outputs.MODEL.path_prefix" in message, message


def test_a_lone_gpu_node_gets_the_gpu_preflight() -> None:
    assert preflight_of({"preflight": "all"}, {}, 1, gpus=True) == "gpu"
    assert preflight_of({}, {"preflight": "gpu"}, 1, gpus=True) == "gpu"
    assert preflight_of({"preflight": "network"}, {}, 1, gpus=True) is None
    assert preflight_of({"preflight": "all"}, {}, 1, gpus=False) is None  # nothing to check
    assert preflight_of({"preflight": "all"}, {}, 2) == "all"
    assert preflight_of({"preflight": "none"}, {"preflight": "all"}, 2, gpus=True) is None
