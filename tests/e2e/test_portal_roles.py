"""The portal respects roles, in a real browser (Chromium driven by Playwright) against a
real server (issue 32): users sign in with their personal tokens; a reader sees jobs and
who submitted them but no terminate or delete button; a contributor sees buttons on their
own jobs only; a workspace the user has no role in is not listed and its pages are refused;
a service account cannot sign in; a disabled user's session ends."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

import strictkit
from teamkit import WS_A, WS_B, Team, make_team
from yardkit import Yard

sync_api = strictkit.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("BATCHYARD_CHROMIUM", "/usr/bin/chromium")
if not os.access(CHROMIUM, os.X_OK):
    strictkit.missing(f"no Chromium at {CHROMIUM} (scripts/setup.sh installs it)")

pytestmark = pytest.mark.timeout(300)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def team(yard: Yard) -> Iterator[Team]:
    made = make_team(yard)
    made.submit("owner", "owners-job")
    made.submit("contributor", "contribs-job")
    yield made
    for name in ("owners-job", "contribs-job"):
        made.cli("admin", "job", "terminate", name, "-w", WS_A)


@pytest.fixture
def as_user(browser: Any, team: Team) -> Iterator[Any]:
    contexts = []

    def sign_in(who: str, path: str = "/jobs") -> Any:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        contexts.append(context)
        page = context.new_page()
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(team.yard.url + path)
        page.fill("#token", team.token(who))
        page.click("#signin")
        page.wait_for_load_state()
        return page

    yield sign_in
    for context in contexts:
        context.close()


def rows(page: Any) -> dict[str, dict[str, Any]]:
    """The jobs table as the user sees it: per job, who submitted it and its buttons."""
    found = {}
    for row in page.locator("#jobs tbody tr[data-job]").all():
        found[row.get_attribute("data-job")] = {
            "by": row.locator('[data-label="by"]').inner_text().strip(),
            "buttons": [b.inner_text() for b in row.locator("button").all()]}
    return found


def test_a_reader_sees_no_buttons(as_user: Any, team: Team) -> None:
    page = as_user("reader", f"/jobs?ws={WS_A}")
    assert page.locator("#signed-in-as").inner_text().strip() == "reader"
    seen = rows(page)
    assert seen["owners-job"] == {"by": "owner", "buttons": []}
    assert seen["contribs-job"] == {"by": "contributor", "buttons": []}
    page.wait_for_timeout(2500)  # the list is redrawn from its data endpoint: still none
    assert all(not r["buttons"] for r in rows(page).values())
    page.goto(team.yard.url + f"/ws/{WS_A}/exp/default/jobs/owners-job")
    assert page.locator("#job-created-by").inner_text().strip() == "owner"
    assert page.locator("#terminate").count() == 0
    page.wait_for_timeout(2500)  # after the page's own refresh too
    assert page.locator("#terminate").count() == 0
    # a form posted by hand is refused all the same
    answer = page.request.post(team.yard.url + f"/ws/{WS_A}/exp/default/jobs/owners-job/"
                               "terminate", headers={"Origin": team.yard.url},
                               form={"csrf": page.locator('meta[name="csrf-token"]')
                                     .get_attribute("content")}, max_redirects=0)
    assert answer.status == 403 and "owner" in answer.text()
    assert team.api("admin", "GET", f"/workspaces/{WS_A}/experiments/default/jobs/"
                    "owners-job").json()["state"] not in ("canceled",)


def test_a_contributor_sees_buttons_on_their_own_jobs_only(as_user: Any, team: Team) -> None:
    page = as_user("contributor", f"/jobs?ws={WS_A}")
    seen = rows(page)
    assert seen["owners-job"]["buttons"] == []
    assert seen["contribs-job"]["buttons"] == ["Terminate"]
    page.wait_for_timeout(2500)
    assert rows(page)["contribs-job"]["buttons"] == ["Terminate"]
    page.goto(team.yard.url + f"/ws/{WS_A}/exp/default/jobs/owners-job")
    assert page.locator("#terminate").count() == 0
    owner = as_user("owner", f"/jobs?ws={WS_A}")
    assert {name: r["buttons"] for name, r in rows(owner).items()} == {
        "owners-job": ["Terminate"], "contribs-job": ["Terminate"]}


def test_a_workspace_without_a_role_is_not_listed(as_user: Any, team: Team) -> None:
    page = as_user("contributor", "/clusters")
    options = page.locator("select[name=ws] option").all_inner_texts()
    assert options == [WS_A]
    assert WS_B not in page.content()
    page.goto(team.yard.url + f"/jobs?ws={WS_B}")
    assert "Not allowed" in page.content() and "reader" in page.content()
    answer = page.request.get(team.yard.url + f"/portal/api/ws/{WS_B}/jobs")
    assert answer.status == 403
    other = as_user("other_owner", "/clusters")
    assert other.locator("select[name=ws] option").all_inner_texts() == [WS_B]
    nobody = as_user("norole", "/clusters")
    assert "no role in any workspace" in nobody.content()
    admin = as_user("admin", "/clusters")
    assert {WS_A, WS_B} <= set(admin.locator("select[name=ws] option").all_inner_texts())


def test_who_may_not_sign_in(browser: Any, team: Team) -> None:
    team.yard.ok("user", "create", "portal-bot", "--service")
    bot = team.yard.js("token", "create", "--user", "portal-bot")["token"]
    context = browser.new_context()
    try:
        page = context.new_page()
        for token, said in ((bot, "service account"), ("pat.nonsense", "not valid")):
            page.goto(team.yard.url + "/login")
            page.fill("#token", token)
            page.click("#signin")
            page.wait_for_load_state()
            assert said in page.locator("#login-error").inner_text()
            assert re.search(r"/login", page.url)
    finally:
        context.close()


def test_a_disabled_users_session_ends(as_user: Any, team: Team) -> None:
    page = as_user("reader", f"/jobs?ws={WS_A}")
    assert rows(page)
    team.ok("admin", "user", "disable", "reader")
    try:
        page.goto(team.yard.url + f"/jobs?ws={WS_A}")
        assert "/login" in page.url
        assert "session has ended" in page.locator("#login-error").inner_text()
        page.goto(team.yard.url + f"/jobs?ws={WS_A}")  # signed out now: the sign-in page
        assert "/login" in page.url and page.locator("#token").count() == 1
    finally:
        team.ok("admin", "user", "enable", "reader")
