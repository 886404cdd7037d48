"""An output's id is spelt one way everywhere (issue 33 #18): the directory a rank writes
(``$BATCHYARD_OUTPUT_<ID>``, ``$AZ_BATCHAI_OUTPUT_<ID>``), with or without a Batch AI
``pathPrefix``, ends in the id exactly as the job file spells it, which is also how `job file
list` names it (``outputs/<ID>/...``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchyard.node.env import node_dirs, node_env
from batchyard.node.plan import NodePlan


def _plan(tmp_path: Path, outputs: dict[str, dict[str, str]]) -> NodePlan:
    return NodePlan(job_id=1, job_name="j", workspace="w", experiment="e", attempt=1,
                    attempt_uuid="u", node_rank=0, node_names=["n0"], node_addrs=["10.0.0.4"],
                    distribution={"type": "pytorch", "processes_per_node": 1},
                    command="true", prepare=None, attempt_dir=str(tmp_path / "a"),
                    node_dir=str(tmp_path / "n"), checkpoint_dir=str(tmp_path / "c"),
                    master_addr="10.0.0.4", master_port=29500, gpus=None, cpus=1,
                    outputs=outputs)


@pytest.mark.parametrize("ident", ["MODEL", "model", "Model_2"])
@pytest.mark.parametrize("prefix", [None, "$AZ_BATCHAI_JOB_MOUNT_ROOT/result"])
def test_the_output_directory_is_named_as_the_id(tmp_path: Path, ident: str,
                                                 prefix: str | None) -> None:
    plan = _plan(tmp_path, {ident: {"path_prefix": prefix} if prefix else {}})
    dirs = node_dirs(plan)
    path = dirs.outputs[ident]
    assert path.name == ident and path.parent.name == "outputs", path
    env = node_env(plan, dirs)
    assert env[f"BATCHYARD_OUTPUT_{ident}"] == env[f"AZ_BATCHAI_OUTPUT_{ident}"] == str(path)
    if prefix:  # the seed's $AZ_BATCHAI_OUTPUT_MODEL under the job's mount root
        assert str(path).startswith(str(dirs.job_mount_root / "result"))
