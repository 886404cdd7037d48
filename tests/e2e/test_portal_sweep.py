"""The portal's sweep page in a real browser (Chromium via Playwright) against a real server
and a real, small sweep (a grid of 3 one-node trials that log a metric): the trials table,
the objective over trials and the parallel-coordinates chart fill in; a parameter value
holding HTML stays text; the page keeps the portal's CSP (no inline script runs)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

import strictkit
from yardkit import Yard, wait_until

sync_api = strictkit.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("BATCHYARD_CHROMIUM", "/usr/bin/chromium")
if not os.access(CHROMIUM, os.X_OK):
    strictkit.missing(f"no Chromium at {CHROMIUM} (scripts/setup.sh installs it)")

pytestmark = pytest.mark.timeout(180)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
XSS = "<img src=x onerror=alert(1)>"
LOG = ("import os, sys; from batchyard.sdk.metrics import log_metric, flush; "
       "a = float(sys.argv[1]); [log_metric('score', a * s, step=s) for s in (1, 2, 3)]; "
       "flush(10)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def test_sweep_page_shows_trials_and_charts(yard: Yard, cluster2: str, browser: Any) -> None:
    spec = {
        "name": "pageview", "cluster": cluster2, "distribution": {"type": "custom"},
        "command": ["python", "-c", LOG, "${{search_space.a}}"],
        "sweep": {"search_space": {"a": {"type": "choice", "values": [1, 2, 3]},
                                   "label": {"type": "choice", "values": [XSS]}},
                  "sampling": "grid",
                  "objective": {"primary_metric": "score", "goal": "maximize"},
                  "limits": {"max_concurrent_trials": 2}},
    }
    made = yard.js("sweep", "create", "-f", str(yard.write_job("pageview", spec)), "-e",
                   "portal-sweeps")
    assert made["limits"]["max_total_trials"] == 3
    wait_until(lambda: yard.http.get("/workspaces/default/experiments/portal-sweeps/sweeps/"
                                     "pageview").json()["state"] == "succeeded", 90, 0.5,
               "the sweep to end")
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    alerts: list[str] = []
    page.on("dialog", lambda d: (alerts.append(d.message), d.dismiss()))
    page.goto(yard.url + "/ws/default/exp/portal-sweeps/sweeps/pageview")
    page.fill("#token", yard.token)
    page.click("#signin")
    page.wait_for_url(re.compile(r".*/sweeps/pageview$"))
    # a locator's wait, not wait_for_function: a string predicate that must poll is eval'd
    # again in the page, which the page's CSP (no 'unsafe-eval') refuses (a slow page)
    sync_api.expect(page.locator("#parallel svg")).to_have_attribute("data-lines", "3",
                                                                    timeout=60_000)
    rows = page.locator("#trials tbody tr")
    assert rows.count() == 3
    assert rows.nth(0).locator("td").nth(0).inner_text() == "2"  # best first: a=3
    assert page.locator("#objective-chart svg").get_attribute("data-points") == "6"
    assert XSS in page.locator("#trials tbody").inner_text()  # shown as text
    assert page.locator("#trials img").count() == 0 and not alerts
    headers = page.request.get(yard.url + "/ws/default/exp/portal-sweeps/sweeps/pageview"
                               ).headers
    assert "script-src 'self'" in headers["content-security-policy"]
    page.goto(yard.url + "/ws/default/exp/portal-sweeps")
    assert page.locator("#sweeps a", has_text="pageview").count() == 1
    context.close()
