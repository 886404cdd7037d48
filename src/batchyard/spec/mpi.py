"""The job's ``mpi`` block: which MPI the job's mpirun is, and the escape hatch for what
batchyard's mpirun line does not say (Open MPI MCA parameters, more mpirun arguments)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from batchyard.node.ompi import MCA_NAME, OWNED_MCA, OWNED_OPTIONS
from batchyard.spec.base import SpecModel


class MpiSettings(SpecModel):
    """mpi jobs: which MPI the job's mpirun is (the launcher's hostfile and options follow
    it). Batch AI's customMpiSettings and horovodSettings run with any of them."""

    flavour: Literal["openmpi", "mpich", "intelmpi"] | None = Field(
        None, validation_alias=AliasChoices("flavour", "flavor"),
        description="None: detected from `mpirun --version` on the nodes (in the image, for "
        "container jobs).")
    mca: dict[str, str] = Field(
        default_factory=dict,
        description="Open MPI MCA parameters, {name: value} (e.g. {btl_tcp_eager_limit: "
        "65536}): given to batchyard's mpirun line as --mca NAME VALUE, over batchyard's own "
        "for the same name, and to a custom job's own mpirun as OMPI_MCA_NAME.")
    extra_args: list[str] = Field(
        default_factory=list, max_length=256,
        description="mpi jobs: more arguments for batchyard's mpirun line, after its own "
        "(e.g. [--report-bindings]); -np and the hostfile are batchyard's.")

    @field_validator("flavour", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("mca", mode="before")
    @classmethod
    def _mca_values(cls, value: Any) -> Any:
        from batchyard.spec.job import stringify_env  # (job.py imports this module)

        return stringify_env(value)

    @field_validator("mca")
    @classmethod
    def _mca(cls, value: dict[str, str]) -> dict[str, str]:
        return check_mca(value)

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, value: list[str]) -> list[str]:
        return check_mpirun_args(value)

    @model_validator(mode="after")
    def _mca_is_open_mpi(self) -> MpiSettings:
        if self.mca and self.flavour in ("mpich", "intelmpi"):
            raise ValueError(f"mca: MCA parameters are Open MPI's; this job's MPI is "
                             f"{self.flavour} (give its options in extra_args or env)")
        return self


def check_mca(value: dict[str, str]) -> dict[str, str]:
    for key, item in value.items():
        if not MCA_NAME.match(key):
            raise ValueError(f"{key!r} is not an MCA parameter name (lower-case letters, "
                             "digits and _, as in btl_tcp_if_include)")
        if key in OWNED_MCA:
            raise ValueError(f"{key!r}: batchyard's relay starts the MPI daemons on the "
                             "nodes (there is no ssh); it cannot be changed")
        if "\n" in item:
            raise ValueError(f"{key!r}: a value on one line")
    return value


def check_mpirun_args(value: list[str]) -> list[str]:
    for index, arg in enumerate(value):
        option = arg.split("=", 1)[0]
        if option in OWNED_OPTIONS:
            raise ValueError(f"[{index}] {arg!r}: batchyard sets the process count and the "
                             "hostfile from the job (nodes, processes_per_node, "
                             "process_count)")
        if not arg:
            raise ValueError(f"[{index}]: an empty argument")
    return value
