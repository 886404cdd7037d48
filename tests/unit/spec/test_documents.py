"""spec/documents.py tells a job file's format without the spec's models (the CLI's quick
path and `job create` load a format's models only for a file of that format)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from batchyard.errors import SpecError
from batchyard.spec import documents


def test_batchai_framework_blocks_are_the_schemas() -> None:
    from batchyard.spec.batchai import FRAMEWORKS

    assert set(documents.BATCHAI_FRAMEWORKS) == set(FRAMEWORKS)


def test_no_models_are_loaded_to_tell_a_format(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("command: 'true'\n")
    code = ("import json, sys\n"
            "from batchyard.spec.documents import detect_job_format, read_document\n"
            f"fmt = detect_job_format(read_document({str(job)!r}))\n"
            "print(json.dumps([fmt, sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pydantic', 'typer', 'rich', 'httpx') or m.startswith('batchyard.spec.') and "
            "m != 'batchyard.spec.documents')]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert json.loads(out) == ["native", []]


@pytest.mark.parametrize("data, fmt", [
    ({"command": "x"}, "native"),
    ({"nodeCount": 1, "customToolkitSettings": {}}, "batchai"),
    ({"properties": {}}, "batchai"),
    ({"$schema": "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"}, "aml"),
    ({"type": "command", "command": "x"}, "aml"),
])
def test_formats(data: dict[str, object], fmt: str) -> None:
    assert documents.detect_job_format(data) == fmt


def test_syntax_errors_name_the_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("command: x\nnodes: [1\n")
    with pytest.raises(SpecError, match=r"job.yaml: line \d+, column \d+: invalid YAML"):
        documents.read_document(bad)
    bad_json = tmp_path / "job.json"
    bad_json.write_text('{"a": 1,}')
    with pytest.raises(SpecError, match=r"job.json: line 1, column 9: invalid JSON"):
        documents.read_document(str(bad_json))
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"command": "x"}')
    assert documents.read_document(bom) == {"command": "x"}
