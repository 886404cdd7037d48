"""The README's `az batchai` section and examples/mnist-mpi/README.md say what is true: the
job file it names fits the size it creates, the exit codes are the CLI's, and every property
`job.json` changed from seed 000's job is named."""

from __future__ import annotations

import json
import re
from pathlib import Path

from batchyard.cli import common
from batchyard.spec.batchai import read_batchai_job
from batchyard.spec.sizes import lookup

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "mnist-mpi"
# seed 000's job.json, its properties as the article gives them (values that stay the same)
SEED_000 = {
    "nodeCount": 2,
    "chainerSettings": {
        "pythonScriptFilePath": "$AZ_BATCHAI_JOB_MOUNT_ROOT/scripts/chainer/train_mnist.py",
        "commandLineArgs": "-g --communicator non_cuda_aware -o $AZ_BATCHAI_OUTPUT_MODEL",
        "processCount": 8},
    "jobPreparation": {"commandLine": "bash $AZ_BATCHAI_JOB_MOUNT_ROOT/scripts/chainer/jobprep.sh"},
    "stdOutErrPathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/logs",
    "mountVolumes": "(storage account)",
    "outputDirectories": [{"id": "MODEL", "pathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/result"}],
    "containerSettings": {"imageSourceRegistry": {"image": "batchaitraining/chainermn:IntelMPI"}},
}


def _changed(seed: dict[str, object], ours: dict[str, object], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(seed) | set(ours)):
        a, b = seed.get(key), ours.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changed(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(prefix + key)
    return out


def test_mnist_mpi_readme_names_every_change_from_seed_000() -> None:
    ours = json.loads((EXAMPLE / "job.json").read_text())["properties"]
    changed = _changed(SEED_000, ours)
    assert changed == ["chainerSettings.pythonScriptFilePath", "containerSettings",
                       "jobPreparation.commandLine", "mountVolumes"]
    text = (EXAMPLE / "README.md").read_text()
    assert "as is" not in text
    for path in changed:
        assert path.split(".")[0] in text and path.split(".")[-1] in text, path


def test_readme_az_batchai_section_runs_the_named_job_file() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## From `az batchai` to `batchyard`", 1)[1].split("\n## ", 1)[0]
    assert "`examples/mnist-mpi/job.json`" in section
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    assert "cd examples/mnist-mpi" in block and "-f job.json" in block
    size = re.search(r"cluster create .* -s (\S+) -t (\d+)", block)
    assert size is not None
    spec = read_batchai_job(json.loads((EXAMPLE / "job.json").read_text()))
    assert int(size.group(2)) == spec.nodes
    assert lookup(size.group(1)).vcpus >= spec.distribution.processes_per_node == 4


def test_readme_exit_codes_are_the_clis() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    for code, words in ((common.EXIT_BAD_INPUT, "bad input"),
                        (common.EXIT_NOT_FOUND, "not found"),
                        (common.EXIT_UNREACHABLE, "no server answers")):
        assert f"`{code}` {words}" in text, (code, words)
