"""The portal's fixes of issue 33 (#19) in a real browser (Debian's Chromium via Playwright)
against a real server: an experiment's runs newest first, a page at a time; each cluster's
queue depth; node tables that show every column on a 390-px phone (cards); a sweep's
log-uniform parameter on a log axis whose labels stay readable at 390 px; and `batchyard
portal --open`'s one-time sign-in link (signs in once, then refuses; never the admin token).
Screenshots go to ``test-artifacts/portal-33/``."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import strictkit
from yardkit import Yard, wait_until

sync_api = strictkit.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("BATCHYARD_CHROMIUM", "/usr/bin/chromium")
if not os.access(CHROMIUM, os.X_OK):
    strictkit.missing(f"no Chromium at {CHROMIUM} (scripts/setup.sh installs it)")

pytestmark = pytest.mark.timeout(300)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "portal-33"
RUNS = 121  # a holder and 120 queued behind it
LOG = ("import sys; from batchyard.sdk.metrics import log_metric, flush; "
       "lr = float(sys.argv[1]); log_metric('score', -abs(lr - 0.01), step=1); flush(10)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def signed_in(browser: Any, yard: Yard, width: int) -> Any:
    context = browser.new_context(viewport={"width": width, "height": 800})
    page = context.new_page()
    page.goto(yard.url + "/login?next=/jobs")
    page.fill("#token", yard.token)
    page.click("#signin")
    page.wait_for_url(re.compile(r".*/jobs$"))
    return page


@pytest.fixture(scope="module")
def queue(yard: Yard) -> str:
    """Cluster `one` (1 node) with a job holding it and 120 queued behind it, experiment
    `many`."""
    yard.ok("cluster", "create", "-n", "one", "-s", "Standard_D2_v2", "-t", "1", "--wait")
    marker = yard.work / "release-many"
    body = {"spec": {"command": f"until [ -e {marker} ]; do sleep 0.2; done",
                     "limits": {"grace_period": 1}},
            "experiment": "many", "cluster": "one", "name": "run-000"}
    assert yard.http.post("/workspaces/default/jobs", json=body).status_code == 201
    yard.wait_job("run-000", ("running",), timeout=60, experiment="many")
    for i in range(1, RUNS):
        body = {"spec": {"command": "true"}, "experiment": "many", "cluster": "one",
                "name": f"run-{i:03d}"}
        resp = yard.http.post("/workspaces/default/jobs", json=body)
        assert resp.status_code == 201, resp.text
    yield "one"
    marker.touch()


def test_experiment_runs_newest_first_a_page_at_a_time(yard: Yard, queue: str,
                                                       browser: Any) -> None:
    page = signed_in(browser, yard, 1280)
    try:
        page.goto(yard.url + "/ws/default/exp/many")
        names = page.locator("#runs tbody tr td.name").all_inner_texts()
        assert len(names) == 50, len(names)
        assert names[0] == f"run-{RUNS - 1:03d}" and names[-1] == f"run-{RUNS - 50:03d}", names
        assert page.locator("#runs-range").inner_text() == f"1\u201350 of {RUNS}, newest first"
        assert page.locator("#runs-newest").count() == 0
        page.click("#runs-older")
        names = page.locator("#runs tbody tr td.name").all_inner_texts()
        assert names[0] == f"run-{RUNS - 51:03d}" and len(names) == 50, names
        assert page.locator("#runs-range").inner_text() == f"51\u2013100 of {RUNS}, newest first"
        page.click("#runs-older")
        names = page.locator("#runs tbody tr td.name").all_inner_texts()
        assert names[-1] == "run-000" and len(names) == RUNS - 100, names
        assert page.locator("#runs-older").count() == 0
        page.click("#runs-newest")
        assert page.locator("#runs tbody tr td.name").first.inner_text() == \
            f"run-{RUNS - 1:03d}"
    finally:
        page.context.close()


def test_clusters_page_shows_each_clusters_queue(yard: Yard, queue: str,
                                                 browser: Any) -> None:
    page = signed_in(browser, yard, 1280)
    try:
        page.goto(yard.url + "/clusters")
        depth = page.locator(f"[data-cluster='{queue}'] dd.queue")
        assert depth.inner_text() == f"{RUNS - 1} queued, 1 running"
        page.wait_for_timeout(2500)  # after the live refresh too
        assert depth.inner_text() == f"{RUNS - 1} queued, 1 running"
        assert depth.get_attribute("data-queued") == str(RUNS - 1)
    finally:
        page.context.close()


OFF_SCREEN_JS = """(sel) => {
  const out = [];
  for (const td of document.querySelectorAll(sel)) {
    if (!td.textContent.trim() && getComputedStyle(td).display === 'none') continue;  // empty
    const r = td.getBoundingClientRect();
    const label = getComputedStyle(td, '::before').content;
    if (r.width === 0 || r.left < 0 || r.right > innerWidth + 1)
      out.push('off: ' + td.dataset.label);
    if (!label || label === 'none' || label === 'normal') out.push('unlabelled: ' + td.className);
  }
  return out;
}"""


def test_node_tables_show_every_column_on_a_phone(yard: Yard, queue: str,
                                                  browser: Any) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = signed_in(browser, yard, 390)
    try:
        page.goto(yard.url + "/clusters")
        cells = f"[data-cluster='{queue}'] table.nodes tbody tr[data-node] td"
        assert page.locator(cells).count() == 8
        assert page.evaluate(OFF_SCREEN_JS, cells) == []
        page.wait_for_timeout(2500)  # the live redraw keeps it
        assert page.evaluate(OFF_SCREEN_JS, cells) == []
        page.screenshot(path=str(ARTIFACTS / "clusters-390.png"), full_page=True)
        page.goto(yard.url + "/ws/default/exp/many/jobs/run-000")
        status = "#node-status tbody tr[data-node] td"
        page.wait_for_selector(status)
        assert page.locator(status).count() == 5
        assert page.evaluate(OFF_SCREEN_JS, status) == []
        page.screenshot(path=str(ARTIFACTS / "job-390.png"), full_page=True)
    finally:
        page.context.close()


LABELS_JS = """() => {
  const boxes = Array.from(document.querySelectorAll('#parallel svg text'))
    .map((t) => ({ text: t.textContent, r: t.getBoundingClientRect(),
                   size: parseFloat(getComputedStyle(t).fontSize) }));
  const small = boxes.filter((b) => b.r.height < 10 || b.size < 10).map((b) => b.text);
  const overlaps = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i].r, b = boxes[j].r;
    const apart = a.right - 1 <= b.left || b.right - 1 <= a.left || a.bottom - 1 <= b.top
      || b.bottom - 1 <= a.top;
    if (!apart) overlaps.push(boxes[i].text + ' / ' + boxes[j].text);
  }
  return { small, overlaps, n: boxes.length };
}"""


def test_sweep_log_axis_readable_on_a_phone(yard: Yard, cluster2: str, browser: Any) -> None:
    spec = {"name": "lrsweep", "cluster": cluster2, "distribution": {"type": "custom"},
            "command": ["python", "-c", LOG, "${{search_space.learning_rate}}"],
            "sweep": {"search_space": {"learning_rate": {"type": "loguniform",
                                                         "min_value": -9.2, "max_value": -0.1},
                                       "batch_size": [16, 32, 64]},
                      "sampling": {"type": "random", "seed": 3},
                      "objective": {"primary_metric": "score", "goal": "maximize"},
                      "limits": {"max_total_trials": 6, "max_concurrent_trials": 2}}}
    yard.js("sweep", "create", "-f", str(yard.write_job("lrsweep", spec)), "-e", "lr")
    wait_until(lambda: yard.http.get("/workspaces/default/experiments/lr/sweeps/lrsweep")
               .json()["state"] == "succeeded", 180, 0.5, "the sweep to end")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for width in (1280, 390):
        page = signed_in(browser, yard, width)
        try:
            page.goto(yard.url + "/ws/default/exp/lr/sweeps/lrsweep")
            sync_api.expect(page.locator("#parallel svg")).to_have_attribute(
                "data-lines", "6", timeout=60_000)
            axis = page.locator("#parallel g[data-axis='learning_rate']")
            assert axis.get_attribute("data-scale") == "log"
            assert "(log)" in (axis.locator("text.axis-title").text_content() or "")
            assert page.locator("#parallel g[data-axis='batch_size']").get_attribute(
                "data-scale") == "choice"
            ticks = axis.locator("text.tick")
            values = [float(v) for v in ticks.all_text_contents()]
            assert len(values) >= 2 and all(
                math.isclose(math.log10(v), round(math.log10(v))) for v in values), values
            ys = [float(ticks.nth(i).get_attribute("y") or 0) for i in range(ticks.count())]
            gaps = [round(a - b, 1) for a, b in itertools.pairwise(ys)]
            assert len(set(gaps)) <= 1 or max(gaps) - min(gaps) < 1.0, gaps  # decades even
            found = page.evaluate(LABELS_JS)
            assert found["n"] >= 8 and found["small"] == [], found
            assert found["overlaps"] == [], found
            box = page.evaluate("""() => ({ scroll: document.scrollingElement.scrollWidth,
                                            inner: innerWidth })""")
            assert box["scroll"] <= box["inner"], box  # the chart scrolls in its box
            page.screenshot(path=str(ARTIFACTS / f"sweep-{width}.png"), full_page=True)
        finally:
            page.context.close()


def test_portal_open_prints_a_one_time_sign_in_link(yard: Yard, browser: Any) -> None:
    # the "browser" opened is `true` (none can open here): the link is printed either way
    opened = subprocess.run([sys.executable, "-m", "batchyard.cli.main", "portal", "--open",
                             "-o", "json"], env={**yard.env, "BROWSER": "true"},
                            capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert opened.returncode == 0, opened
    data = json.loads(opened.stdout)
    link = data["url"]
    assert data["one_time"] is True and data["expires_in"] <= 300
    assert link.startswith(yard.url + "/signin?token=") and yard.token not in link
    first = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = first.new_page()
        page.goto(link)
        page.wait_for_url(re.compile(r".*/clusters$"))  # signed in: no token asked for
        assert page.locator("#token").count() == 0
        assert page.locator("h1", has_text="Clusters").count() == 1
    finally:
        first.close()
    second = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = second.new_page()
        resp = page.goto(link)
        assert resp is not None and resp.status == 401
        assert "used already or has expired" in page.inner_text("main")
        page.goto(yard.url + "/clusters")
        page.wait_for_url(re.compile(r".*/login.*"))  # the second browser is not signed in
    finally:
        second.close()
    said = subprocess.run([sys.executable, "-m", "batchyard.cli.main", "portal", "--open"],
                          env={**yard.env, "BROWSER": "true"}, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert said.stdout.startswith(yard.url + "/signin?token="), said
    assert "one-time sign-in link" in said.stderr and "server token" not in said.stderr
