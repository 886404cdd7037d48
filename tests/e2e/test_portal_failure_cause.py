"""The job page's header gains the failure cause and the failing rank's last lines while the
page is open (its poll, no reload), in a real Chromium driven by Playwright."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

import strictkit
from yardkit import Yard

sync_api = strictkit.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("BATCHYARD_CHROMIUM", "/usr/bin/chromium")
if not os.access(CHROMIUM, os.X_OK):
    strictkit.missing(f"no Chromium at {CHROMIUM} (scripts/setup.sh installs it)")

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
FAIL = ('python -c \'import os, pathlib, time\n'
        'go = pathlib.Path(os.environ["AZ_BATCHAI_SHARED_JOB_TEMP"], "go")\n'
        'while not go.exists(): time.sleep(0.1)\n'
        'raise ValueError("portal boom <b>")\'')


@pytest.fixture(scope="module")
def page(yard: Yard) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
        browser.close()


def test_the_header_shows_the_cause_once_the_job_fails(yard: Yard, page: Any) -> None:
    yard.ok("cluster", "create", "-n", "pc", "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster("pc", 1)
    path = yard.write_job("pfail", {"name": "pfail", "command": FAIL})
    yard.ok("job", "create", "-f", str(path), "-c", "pc")
    job = yard.wait_job("pfail", ("running",), timeout=120)
    page.goto(f"{yard.url}/ws/default/exp/default/jobs/pfail")
    page.fill("#token", yard.token)
    page.click("#signin")
    page.wait_for_url(re.compile(r".*/jobs/pfail$"))
    assert page.locator("#job-cause").is_hidden() and page.locator("#job-error").is_hidden()
    (yard.node_attempt_dirs(job)[0] / "shared" / "go").touch()
    cause = page.locator("#job-cause")
    cause.wait_for(state="visible", timeout=60_000)
    assert cause.inner_text() == "user code error"
    lines = page.locator("#job-error").inner_text()
    assert lines.startswith("Traceback") and lines.endswith("ValueError: portal boom <b>"), lines
    assert page.locator("#job-error b").count() == 0  # text, never markup
    assert "portal boom" in page.locator("#job-reason").inner_text()
