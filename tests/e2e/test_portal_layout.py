"""The portal's layout and live lists in a real browser (Debian's Chromium via Playwright)
against one real server: every page at 1280 and 390 px has no sideways page overflow (wide
tables scroll inside their wrapper) and no word broken across lines in pills, buttons, headers,
navigation and facts; charts have round ticks, axis titles, hover values and a log toggle, and a
metric logged once shows as a value; errors are portal pages (the APIs keep JSON); a queued
job's log pane says why it waits; the jobs and clusters pages follow changes without a reload.
Screenshots go to ``test-artifacts/portal-layout/``."""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
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
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "portal-layout"
EXP = "layout"
WIDTHS = (1280, 390)
CURVE = """
import batchyard
from batchyard.sdk import flush
for step in range(12):
    batchyard.log_metric("loss", 3.0 / (step + 1), step=step)
    batchyard.log_metric("val_loss", 3.3 / (step + 1), step=step)
    print(f"step {step}", flush=True)
batchyard.log_metric("accuracy", 0.93)
flush()
"""
SWEEP = ("import sys; from batchyard.sdk.metrics import log_metric, flush; "
         "a = float(sys.argv[1]); [log_metric('score', a * s, step=s) for s in (1, 2)]; "
         "flush(10)")
HOLD = "python -c \"print('holding', flush=True); import time; time.sleep(240)\""
# Text whose words must each stay on one line (whitespace-separated; a break at a hyphen
# inside a name counts as a break too).
WORDS = ("nav a, th, button, .pill, .count, .facts dt, .facts dd, td.name, td.num, "
         "td.nowrap, td a, h1, h2, h3, label, .legend span, .single-value span, "
         ".error-message")
BROKEN_WORDS_JS = """(sel) => {
  const bad = [];
  for (const el of document.querySelectorAll(sel)) {
    if (!el.getClientRects().length) continue;
    const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      if (n.parentElement.closest('select, option, .log, .spec')) continue;
      const re = /\\S+/g; let m;
      while ((m = re.exec(n.data))) {
        const r = document.createRange();
        r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
        const tops = new Set(Array.from(r.getClientRects()).filter((x) => x.width > 0)
          .map((x) => Math.round(x.top)));
        if (tops.size > 1) bad.push(el.tagName.toLowerCase() + '.' + el.className + ': ' + m[0]);
      }
    }
  }
  return bad;
}"""
OVERFLOW_JS = """() => {
  const wide = [];
  for (const t of document.querySelectorAll('table')) {
    const out = t.getBoundingClientRect().right > innerWidth + 1;
    if (out && !t.closest('.scrollx')) wide.push(t.className);
  }
  return { scroll: document.scrollingElement.scrollWidth, inner: innerWidth, wide };
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def submit(yard: Yard, name: str, spec: dict[str, Any], files: dict[str, str] | None = None,
           experiment: str = EXP) -> None:
    folder = yard.write_job(name, {"x": 1}, files).parent
    body = {"spec": {"code": str(folder), **spec}, "experiment": experiment, "name": name}
    resp = yard.http.post("/workspaces/default/jobs", json=body)
    assert resp.status_code == 201, resp.text


def job_path(name: str, experiment: str = EXP) -> str:
    return f"/ws/default/exp/{experiment}/jobs/{name}"


def end_job(yard: Yard, name: str) -> None:
    if yard.http.get(f"/workspaces/default/experiments/{EXP}/jobs/{name}").status_code != 200:
        return
    yard.http.post(f"/workspaces/default/experiments/{EXP}/jobs/{name}/terminate")
    yard.wait_job(name, timeout=60, experiment=EXP)


@pytest.fixture(scope="module")
def seeded(yard: Yard, cluster2: str) -> dict[str, str]:
    """A finished job with metrics, a failed one, a small sweep, then one job running on one
    node and one queued behind it (it needs both)."""
    submit(yard, "curve", {"nodes": 1, "command": "python curve.py"}, {"curve.py": CURVE})
    submit(yard, "oops", {"nodes": 1, "command": "echo about to fail; exit 3"})
    sweep = {"name": "tiny", "cluster": cluster2, "distribution": {"type": "custom"},
             "command": ["python", "-c", SWEEP, "${{search_space.a}}"],
             "sweep": {"search_space": {"a": {"type": "choice", "values": [1, 2]}},
                       "sampling": "grid", "limits": {"max_concurrent_trials": 2},
                       "objective": {"primary_metric": "score", "goal": "maximize"}}}
    yard.js("sweep", "create", "-f", str(yard.write_job("tiny", sweep)), "-e", EXP)
    assert yard.wait_job("curve", timeout=90, experiment=EXP)["state"] == "succeeded"
    assert yard.wait_job("oops", timeout=90, experiment=EXP)["state"] == "failed"
    wait_until(lambda: yard.http.get(f"/workspaces/default/experiments/{EXP}/sweeps/tiny")
               .json()["state"] == "succeeded", 120, 0.5, "the sweep to end")
    submit(yard, "holder", {"nodes": 1, "command": HOLD})
    yard.wait_job("holder", ("running",), timeout=60, experiment=EXP)
    submit(yard, "waiter", {"nodes": 2, "command": "echo never"})
    wait_until(lambda: yard.job("waiter", EXP)["pending_reason"], 30, 0.2, "a pending reason")
    return {"clusters": "/clusters", "jobs": "/jobs?ws=default",
            "experiments": "/experiments?ws=default", "experiment": f"/ws/default/exp/{EXP}",
            "job-finished": job_path("curve"), "job-failed": job_path("oops"),
            "job-running": job_path("holder"), "job-queued": job_path("waiter"),
            "sweep": f"/ws/default/exp/{EXP}/sweeps/tiny",
            "not-found": job_path("no-such-job"), "no-page": "/no/such/page"}


def signed_in(browser: Any, yard: Yard, width: int, **kw: Any) -> Any:
    context = browser.new_context(viewport={"width": width, "height": 800}, **kw)
    page = context.new_page()
    page.on("dialog", lambda d: d.accept())
    page.goto(yard.url + "/login?next=/jobs")
    page.fill("#token", yard.token)
    page.click("#signin")
    page.wait_for_url(re.compile(r".*/jobs$"))
    return page


def check_layout(page: Any, what: str) -> None:
    box = page.evaluate(OVERFLOW_JS)
    assert box["scroll"] <= box["inner"], (what, box)
    assert not box["wide"], (what, box)
    assert page.evaluate(BROKEN_WORDS_JS, WORDS) == [], what


@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_fits_without_broken_words(yard: Yard, seeded: dict[str, str],
                                              browser: Any, width: int) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = signed_in(browser, yard, width)
    try:
        for name, path in seeded.items():
            page.goto(yard.url + path)
            if name == "job-finished":
                page.wait_for_selector('[data-metric="loss"] svg')
                page.wait_for_selector('[data-metric="accuracy"] .single-value')
            elif name in ("job-failed", "job-running"):
                page.wait_for_function("() => document.querySelector('#log-stats').textContent")
            elif name == "sweep":
                page.wait_for_selector("#parallel svg")
            page.wait_for_timeout(300)  # let the first poll land before measuring
            check_layout(page, f"{name} at {width}px")
            page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=True)
        page.context.clear_cookies()
        page.goto(yard.url + "/login")
        check_layout(page, f"login at {width}px")
        page.screenshot(path=str(ARTIFACTS / f"login-{width}.png"), full_page=True)
    finally:
        page.context.close()


def test_errors_are_portal_pages_and_apis_keep_json(yard: Yard, seeded: dict[str, str],
                                                    browser: Any) -> None:
    page = signed_in(browser, yard, 1280)
    try:
        for path, text in ((seeded["not-found"], "no-such-job"), ("/no/such/page", "/no/such")):
            resp = page.goto(yard.url + path)
            assert resp is not None and resp.status == 404
            assert resp.headers["content-type"].startswith("text/html")
            assert page.locator("#error-page").get_attribute("data-status") == "404"
            assert text in page.inner_text(".error-message")
            assert page.locator("nav a", has_text="Jobs").count() == 1  # the portal's header
        data = page.request.get(yard.url + "/portal/api" + seeded["not-found"])
        assert data.status == 404 and data.json()["error"]["code"] == "not_found"
    finally:
        page.context.close()
    api = yard.http.get("/workspaces/default/experiments/layout/jobs/no-such-job")
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"
    nowhere = httpx.get(yard.url + "/api/v1/no/such/route")
    assert nowhere.status_code == 404 and "error" in nowhere.json()


def _nice(labels: list[str]) -> bool:
    values = [float(x) for x in labels]
    steps = {round(b - a, 9) for a, b in itertools.pairwise(values)}
    if len(steps) != 1:
        return False
    step = steps.pop()
    mantissa = step / 10 ** math.floor(math.log10(step))
    return any(math.isclose(mantissa, m) for m in (1, 2, 5))


def test_charts_nice_ticks_titles_hover_log_and_single_values(
        yard: Yard, seeded: dict[str, str], browser: Any) -> None:
    page = signed_in(browser, yard, 1280)
    try:
        page.goto(yard.url + seeded["job-finished"])
        loss = page.locator('[data-metric="loss"]')
        page.wait_for_selector('[data-metric="loss"] svg')
        ticks = loss.locator("svg text.tick-y").all_text_contents()
        assert len(ticks) >= 3 and _nice(ticks), ticks
        assert _nice(loss.locator("svg text.tick-x").all_text_contents())
        assert loss.locator("svg text.axis-title").all_text_contents() == ["step", "loss"]
        loss.locator("svg .hover-area").hover()
        hover = loss.locator("svg").get_attribute("data-hover") or ""
        assert re.match(r"step \d+\nrank 0: [0-9.]+$", hover), hover
        assert loss.locator("svg g.hover").get_attribute("display") is None  # shown
        loss.locator(".log-toggle").check()
        assert loss.locator("svg").get_attribute("data-scale") == "log"
        decades = [float(x) for x in loss.locator("svg text.tick-y").all_text_contents()]
        assert all(any(math.isclose(v / 10 ** math.floor(math.log10(v)), m) for m in (1, 2, 5))
                   for v in decades), decades
        assert "(log)" in loss.locator("svg text.axis-title").all_text_contents()[1]
        # logged once: the value, no chart and no lone dot
        single = page.locator('[data-metric="accuracy"]')
        assert single.locator(".single-value b").inner_text() == "0.93"
        assert single.locator("svg").count() == 0
        # the compare view opens on a metric logged over steps, not on the one-off value
        page.goto(yard.url + seeded["experiment"])
        assert page.locator("#metric").input_value() == "loss"
        page.wait_for_selector("#overlay svg polyline")
        assert page.locator("#overlay svg").get_attribute("data-points") == "12"
        # the Experiments page lists it with its job count and links to it
        page.click("nav a:has-text('Experiments')")
        row = page.locator(f"tr[data-experiment='{EXP}']")
        assert int(row.locator("td.num").inner_text()) >= 4
        row.locator("a").click()
        page.wait_for_url(re.compile(rf".*/ws/default/exp/{EXP}$"))
    finally:
        page.context.close()


def test_queued_job_log_pane_says_why(yard: Yard, seeded: dict[str, str],
                                      browser: Any) -> None:
    page = signed_in(browser, yard, 390)
    try:
        page.goto(yard.url + seeded["job-queued"])
        wait = page.locator("#log-wait")
        assert wait.is_visible()
        reason = yard.job("waiter", EXP)["pending_reason"]
        assert wait.inner_text() == f"Waiting to start: {reason}"
        stats = page.locator("#log-stats").inner_text()
        assert " ms" not in stats and "/s" not in stats  # no developer timings
        times = page.locator("main time").all_inner_texts()
        assert times and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", t) for t in times)
    finally:
        page.context.close()


def test_dark_mode_follows_the_browser(yard: Yard, seeded: dict[str, str],
                                       browser: Any) -> None:
    page = signed_in(browser, yard, 1280, color_scheme="dark")
    try:
        page.goto(yard.url + seeded["jobs"])
        assert page.evaluate("getComputedStyle(document.body).backgroundColor") == \
            "rgb(15, 19, 26)"
        zero = page.locator("#job-counts .count.zero").first
        assert page.evaluate("(e) => getComputedStyle(e).color", zero.element_handle()) == \
            "rgb(154, 164, 181)"  # a zero count is grey, not its state's colour
    finally:
        page.context.close()


@pytest.mark.slow
def test_jobs_and_clusters_pages_go_live(yard: Yard, cluster2: str, browser: Any) -> None:
    for name in ("waiter", "holder"):  # from the layout fixture, when it ran: free the nodes
        end_job(yard, name)
    yard.wait_cluster(cluster2, 2)
    page = signed_in(browser, yard, 1280)
    try:
        page.goto(yard.url + "/jobs?ws=default&experiment=live")
        page.evaluate("window.__sameDocument = true")
        submit(yard, "fresh", {"nodes": 1, "command": "sleep 3"}, experiment="live")
        row = page.locator("tr[data-job='fresh']")
        row.wait_for(timeout=20_000)
        page.wait_for_function("""() => { const r = document.querySelector("tr[data-job='fresh']");
            return r && r.dataset.state === 'succeeded'; }""", timeout=60_000)
        assert row.locator(".pill").inner_text() == "succeeded"
        assert row.locator("button").inner_text() == "Delete"  # the row's action follows
        assert page.locator("#job-counts [data-count='succeeded'] b").inner_text() == "1"
        assert page.evaluate("window.__sameDocument") is True  # no reload

        page.goto(yard.url + "/clusters")
        page.evaluate("window.__sameDocument = true")
        running = page.locator(f"[data-cluster='{cluster2}'] .counts [data-count='running'] b")
        assert running.inner_text() == "0"
        submit(yard, "fresh2", {"nodes": 1, "command": "sleep 6"}, experiment="live")
        page.wait_for_function(f"""() => document.querySelector(
            "[data-cluster='{cluster2}'] .counts [data-count='running'] b").textContent === '1'""",
                               timeout=30_000)
        assert page.locator(f"[data-cluster='{cluster2}'] .nodes a",
                            has_text="fresh2").count() == 1
        page.wait_for_function(f"""() => document.querySelector(
            "[data-cluster='{cluster2}'] .counts [data-count='running'] b").textContent === '0'""",
                               timeout=60_000)
        assert page.evaluate("window.__sameDocument") is True
    finally:
        page.context.close()
