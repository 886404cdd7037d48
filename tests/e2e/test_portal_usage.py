"""The portal's usage page (issue 35 §3) in a real browser (Chromium driven by Playwright)
against a real server: two teams' jobs run; a server admin sees a row per team with the
hours the usage report gives and a chart per kind with a series per team over the days;
anyone else is refused (the usage report's rule: a server admin's) and has no link to it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

import strictkit
from teamkit import CLUSTER_A, WS_A, Team, make_team
from yardkit import Yard

sync_api = strictkit.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("BATCHYARD_CHROMIUM", "/usr/bin/chromium")
if not os.access(CHROMIUM, os.X_OK):
    strictkit.missing(f"no Chromium at {CHROMIUM} (scripts/setup.sh installs it)")

pytestmark = pytest.mark.timeout(300)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TEAMS = {"owner": "vision", "contributor": "nlp"}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def team(yard: Yard) -> Team:
    made = make_team(yard)
    for who, name in TEAMS.items():
        yard.ok("team", "create", name)
        yard.ok("team", "add", name, who)
    for who in TEAMS:
        made.submit(who, f"{who}-run", command="sleep 2")
        made.wait_job(f"{who}-run", ("succeeded",))
    return made


def _sign_in(browser: Any, team: Team, who: str, path: str) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(team.yard.url + path)
    page.fill("#token", team.token(who))
    page.click("#signin")
    page.wait_for_load_state()
    return page


def test_admin_sees_a_row_and_a_series_per_team(browser: Any, team: Team) -> None:
    report = team.api("admin", "GET", "/usage", params={
        "by": "team", "since": time.time() - 7 * 86400}).json()
    want = {r["team"]: r for r in report["rows"]}
    assert set(TEAMS.values()) <= set(want)
    page = _sign_in(browser, team, "admin", "/usage?by=team&days=7")
    try:
        assert page.locator("nav a[href='/usage']").count() == 1
        shown = {}
        for row in page.locator("#usage tbody tr[data-row]").all():
            name = row.get_attribute("data-row")
            shown[name] = float(row.locator('[data-label="CPU-hours"]').inner_text())
        for name in TEAMS.values():
            assert shown[name] > 0
            assert abs(shown[name] - want[name]["cpu_hours"]) <= 1e-4 + 0.01 * shown[name]
        chart = page.locator("#usage-charts [data-kind='cpu_hours'] svg")
        chart.wait_for()
        teams_shown = len(want)
        assert int(chart.get_attribute("data-points") or 0) == 7 * teams_shown
        legend = page.locator("#usage-charts [data-kind='cpu_hours'] .legend").inner_text()
        for name in TEAMS.values():
            assert name in legend
        assert page.locator("#usage-charts [data-kind='gpu_hours'] svg").count() == 1
        by_user = page.goto(team.yard.url + "/usage?by=user&days=1")
        assert by_user is not None and by_user.status == 200
        names = page.locator("#usage tbody tr[data-row]").evaluate_all(
            "rows => rows.map(r => r.dataset.row)")
        assert {"owner", "contributor"} <= set(names)
    finally:
        page.context.close()


def test_others_are_refused(browser: Any, team: Team) -> None:
    page = _sign_in(browser, team, "owner", f"/jobs?ws={WS_A}")
    try:
        assert page.locator("nav a[href='/usage']").count() == 0
        answer = page.goto(team.yard.url + "/usage")
        assert answer is not None and answer.status == 403
        assert "admin" in page.content()
        assert "vision" not in page.locator("main").inner_text()
    finally:
        page.context.close()


def test_a_bad_choice_is_refused_naming_it(browser: Any, team: Team) -> None:
    page = _sign_in(browser, team, "admin", "/usage")
    try:
        answer = page.goto(team.yard.url + "/usage?by=planet")
        assert answer is not None and answer.status == 422
        assert "by: one of" in page.locator("main").inner_text()
        answer = page.goto(team.yard.url + "/usage?days=0")
        assert answer is not None and answer.status == 422
    finally:
        page.context.close()


def test_a_queued_jobs_page_shows_its_estimated_start(browser: Any, team: Team) -> None:
    """Not usage, but the same yard: issue 35 §4's estimate on the portal's job page."""
    yard = team.yard
    for name in ("blocker", "waiter"):
        path = yard.write_job(name, {"name": name, "nodes": 1, "command": "sleep 600",
                                     "distribution": {"type": "custom"},
                                     "limits": {"max_wall_clock": 600}})
        team.ok("owner", "job", "create", "-f", str(path), "-w", WS_A, "-c", CLUSTER_A)
    blocker = team.wait_job("blocker", ("running",))
    waiter = team.wait_job("waiter", ("queued",))
    page = _sign_in(browser, team, "owner", f"/ws/{WS_A}/exp/default/jobs/waiter")
    try:
        box = page.locator("#job-estimate")
        box.wait_for()
        stamp = float(box.locator("time").get_attribute("data-ts") or 0)
        assert abs(stamp - (blocker["started_at"] + 600)) < 2, waiter
        assert page.locator("#job-estimate-label").is_visible()
    finally:
        page.context.close()
        for name in ("waiter", "blocker"):
            team.cli("admin", "job", "terminate", name, "-w", WS_A)
