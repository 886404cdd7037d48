"""The SDK as a newcomer meets it, against a real server: everything the README's SDK section
uses is on the top-level module, that section runs as written, `experiment.submit()` takes
the job files the CLI reads, `job.logs(follow=True)` yields lines, and the "Web View" link of
the azureml compat layer opens the job's page in the portal (not an API URL)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import batchyard
from batchyard.sdk import Workspace, set_default_client

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[2]
CLUSTER = "newcomer-c2"


@pytest.fixture(scope="module")
def ws(yard: Any) -> Iterator[Workspace]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BATCHYARD_HOME", str(yard.home))
        for key in ("BATCHYARD_SERVER", "BATCHYARD_TOKEN", "BATCHYARD_API"):
            mp.delenv(key, raising=False)
        set_default_client(None)
        workspace = batchyard.Workspace.get("default")
        workspace.create_cluster(CLUSTER, vm_size="Standard_D2_v2", nodes=2,
                                 exist_ok=True).wait_ready(timeout=30)
        yield workspace
        set_default_client(None)


def test_top_level_exports_what_the_readme_uses() -> None:
    for name in ("Workspace", "Cluster", "Experiment", "Job", "Run", "JobSpec", "log_metric",
                 "flush", "log_list", "log_row", "log_table", "load_job", "command_job",
                 "python_job", "pytorch_job", "mpi_job", "tensorflow_job",
                 "set_default_client", "default_client"):
        assert name in batchyard.__all__ and name in dir(batchyard), name
        assert getattr(batchyard, name) is getattr(batchyard.sdk, name), name
    with pytest.raises(AttributeError):
        batchyard.no_such_thing  # noqa: B018
    # still light: importing batchyard loads no SDK module until one is used
    code = "import sys, batchyard; print([m for m in sys.modules if m.startswith('batchyard.')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out


def readme_sdk_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Python: the SDK"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_the_readme_sdk_section_runs_as_written(yard: Any, ws: Workspace) -> None:
    code = readme_sdk_block()
    assert "import batchyard" in code and "submit(" in code
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHYARD_")}
    env.update(BATCHYARD_HOME=str(yard.home), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "[cpu2-0/rank0]" in out and "[cpu2-1/rank3]" in out, out  # the file's 2 x 2 job
    assert f"succeeded {yard.url}/ws/default/exp/hello/jobs/hello-distributed" in out, out
    for rank in range(4):
        assert f"rank {rank} of 4" in out, out  # the built job
    assert out.rstrip().endswith("succeeded 0"), out


def test_submit_a_job_file_and_follow_its_lines(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text(json.dumps({"properties": {
        "nodeCount": 2, "customToolkitSettings": {
            "commandLine": 'echo "line one from $AZ_BATCHAI_TASK_INDEX"; echo "line two"'},
        "stdOutErrPathPrefix": "$AZ_BATCHAI_JOB_MOUNT_ROOT/logs"}}))
    exp = ws.experiment("newcomer")
    job = exp.submit(str(tmp_path / "job.json"), name="from-json", cluster=CLUSTER)
    lines = list(job.logs(follow=True))
    assert lines and all(line.endswith("\n") and line.count("\n") == 1 for line in lines), lines
    # customToolkit: the command runs once, on the master node
    assert [line.split("] ", 1)[1] for line in lines] == ["line one from 0\n", "line two\n"]
    assert job.wait(timeout=30)["state"] == "succeeded"
    assert job.data["source_format"] == "batchai"

    spec = batchyard.load_job(REPO / "examples/hello-distributed/job.yaml")
    assert spec.nodes == 2 and Path(str(spec.code)).is_absolute()
    spec.nodes = 1
    single = exp.submit(spec, name="hello-one", cluster=CLUSTER)
    assert single.wait(timeout=60)["state"] == "succeeded"
    assert single.data["nodes"] == 1


def test_portal_links_open_the_job_page(yard: Any, ws: Workspace,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from batchyard.compat.azureml.core.run import Run
    from batchyard.compat.azureml.core.workspace import Workspace as AmlWorkspace

    job = ws.experiment("newcomer").job("from-json")
    url = job.portal_url
    assert url == f"{yard.url}/ws/default/exp/newcomer/jobs/from-json"
    assert "/api/" not in url

    run = Run.get(AmlWorkspace(workspace_name="default"), "from-json")
    assert run.get_portal_url() == url
    run.wait_for_completion(show_output=True)
    assert f"Web View: {url}" in capsys.readouterr().out

    with httpx.Client(base_url=yard.url, timeout=10) as browser:
        first = browser.get(url.removeprefix(yard.url))
        assert first.status_code == 303  # not signed in: to the sign-in page, then back
        assert first.headers["location"] == "/login?next=/ws/default/exp/newcomer/jobs/from-json"
        signed = browser.post("/login", data={"token": yard.token,
                                              "next": "/ws/default/exp/newcomer/jobs/from-json"},
                              headers={"Origin": yard.url})
        assert signed.status_code == 303
        page = browser.get(signed.headers["location"])
        assert page.status_code == 200 and "from-json" in page.text
