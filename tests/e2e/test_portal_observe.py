"""The portal's job page in a real browser (Debian's Chromium driven by Playwright) with what
issue 38 adds: the chart of the job's GPU utilisation beside its own metrics (GPUs from the
tests' fake nvidia-smi) and, once the job has TensorBoard event files, a link that opens the
real TensorBoard, served by the server behind the portal's sign-in."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import strictkit
from yardkit import Yard

sync_api = strictkit.importorskip("playwright.sync_api")
strictkit.importorskip("tensorboard")
strictkit.importorskip("torch")
CHROMIUM = os.environ.get("BATCHYARD_CHROMIUM", "/usr/bin/chromium")
if not os.access(CHROMIUM, os.X_OK):
    strictkit.missing(f"no Chromium at {CHROMIUM} (scripts/setup.sh installs it)")

pytestmark = pytest.mark.timeout(300)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DATA = Path(__file__).resolve().parents[1] / "data"
WRITER = '''
import os, time
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter(os.path.join(os.environ["BATCHYARD_OUTPUT_TB"], "train"))
for step in range(40):
    writer.add_scalar("loss", 1.0 / (step + 1), step)
    writer.flush()
    time.sleep(0.5)
writer.close()
'''


@pytest.fixture(scope="module")
def gpu_yard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Yard]:
    state = tmp_path_factory.mktemp("gpus") / "gpus.json"
    state.write_text(json.dumps([{"index": i, "utilization.gpu": 40 + 20 * i,
                                  "memory.used": 500, "memory.total": 81559}
                                 for i in range(2)]))
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env["PATH"] = f"{DATA / 'nvidia-smi'}{os.pathsep}{y.env['PATH']}"
    y.env.update({"FAKE_NVIDIA_SMI_GPUS": str(state), "BATCHYARD_GPU_SAMPLE_SECONDS": "0.5",
                  "BATCHYARD_EVENT_SYNC_SECONDS": "1"})
    try:
        y.start_server()
        y.ok("cluster", "create", "-n", "gpus", "-s", "Standard_NC12", "-t", "1")
        y.wait_cluster("gpus", 1)
        yield y
    finally:
        y.stop()


@pytest.fixture
def page(gpu_yard: Yard) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        yield context.new_page()
        context.close()
        browser.close()


def test_job_page_charts_gpus_and_links_tensorboard(gpu_yard: Yard, page: Any) -> None:
    path = gpu_yard.write_job("board", {"name": "board", "cluster": "gpus", "code": ".",
                                        "command": "python writer.py", "outputs": {"TB": {}}},
                              {"writer.py": WRITER})
    gpu_yard.ok("job", "create", "-f", str(path))
    gpu_yard.wait_job("board", ("running",), timeout=90)
    job_url = gpu_yard.url + "/ws/default/exp/default/jobs/board"
    page.goto(job_url)
    page.fill("#token", gpu_yard.token)
    page.click("#signin")
    page.wait_for_url(re.compile(re.escape(job_url)))
    chart = page.locator("#gpu-chart svg[data-points]")
    chart.wait_for(timeout=60_000)
    assert "GPU utilisation" in page.locator("#gpu-chart").inner_text()
    legend = page.locator("#gpu-chart .legend").inner_text()
    assert "gpus-0 GPU 0" in legend and "gpus-0 GPU 1" in legend
    link = page.locator("#tensorboard")
    link.wait_for(state="visible", timeout=60_000)  # event files synced while it runs
    assert link.get_attribute("href") == "/portal/tensorboard/ws/default/exp/default/jobs/board/"
    with page.context.expect_page() as opened:
        link.click()
    board = opened.value
    board.wait_for_load_state()
    assert "TensorBoard" in board.title()
    runs = board.evaluate("fetch('data/runs').then(r => r.json())")
    assert runs == ["TB/train"]
    gpu_yard.ok("job", "terminate", "board")
