"""Roles hold on a real server, over HTTP and through the CLI (issue 32): two workspaces,
users with each role, their personal tokens. A reader cannot submit, a contributor cannot
terminate another user's job, nobody without a role in a workspace sees anything of it; the
audit list names who did each; bad tokens, unknown names and the last owner get clear
errors and the documented exit codes (5: a missing role)."""

from __future__ import annotations

import hashlib
import json
import stat
import time
from collections.abc import Iterator
from typing import Any

import pytest

from teamkit import CLUSTER_A, CLUSTER_B, WS_A, WS_B, Team, job_token, make_team
from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(300)
JOBS_A = f"/workspaces/{WS_A}/experiments/default/jobs"
JOBS_B = f"/workspaces/{WS_B}/experiments/default/jobs"


@pytest.fixture(scope="module")
def team(yard: Yard) -> Iterator[Team]:
    made = make_team(yard)
    made.submit("owner", "owned", command='echo "T=$BATCHYARD_TOKEN"; sleep 600')
    made.submit("other_owner", "in-b", ws=WS_B, cluster=CLUSTER_B, command="echo b > out.txt")
    yield made
    for name, ws in (("owned", WS_A), ("mine", WS_A), ("in-b", WS_B)):
        made.cli("admin", "job", "terminate", name, "-w", ws)


def forbidden(resp: Any, role: str) -> None:
    assert resp.status_code == 403, (resp.status_code, resp.text)
    error = resp.json()["error"]
    assert error["code"] == "forbidden" and role in error["message"], error
    assert error["details"]["needed"] == role, error


def test_a_reader_cannot_submit(team: Team) -> None:
    body = {"spec": {"nodes": 1, "distribution": {"type": "custom"}, "command": "true"},
            "name": "by-reader", "cluster": CLUSTER_A}
    forbidden(team.api("reader", "POST", f"/workspaces/{WS_A}/jobs", json=body), "contributor")
    run = team.cli("reader", "job", "create", "-f", team.job_file("by-reader"), "-w", WS_A,
                   "-c", CLUSTER_A)
    assert run.rc == 5, str(run)
    assert "contributor" in run.stderr and "Traceback" not in run.stderr, str(run)
    assert team.api("admin", "GET", f"{JOBS_A}/by-reader").status_code == 404  # none made


def test_a_contributor_cannot_terminate_another_users_job(team: Team) -> None:
    team.submit("contributor", "mine")
    forbidden(team.api("contributor", "POST", f"{JOBS_A}/owned/terminate"), "owner")
    run = team.cli("contributor", "job", "terminate", "owned", "-w", WS_A)
    assert run.rc == 5 and "owner" in run.stderr and "'owned' was submitted by owner" in \
        run.stderr, str(run)
    assert team.api("admin", "GET", f"{JOBS_A}/owned").json()["state"] in (
        "queued", "preparing", "running")
    forbidden(team.api("contributor", "DELETE", f"{JOBS_A}/owned"), "owner")
    # their own job: yes; and an owner may terminate anyone's
    assert team.cli("contributor", "job", "terminate", "mine", "-w", WS_A).rc == 0
    assert team.api("owner", "POST", f"{JOBS_A}/mine/terminate").status_code == 200
    assert team.wait_job("mine", ("canceled",))["created_by"] == "contributor"


def test_jobs_record_their_submitter(team: Team) -> None:
    shown = team.cli("reader", "job", "show", "owned", "-w", WS_A)
    assert shown.rc == 0 and "Submitted by" in shown.stdout and "owner" in shown.stdout
    data = json.loads(team.ok("reader", "job", "show", "owned", "-w", WS_A, "-o",
                              "json").stdout)
    assert data["created_by"] == "owner"
    mine = json.loads(team.ok("owner", "job", "list", "-w", WS_A, "--mine", "-o",
                              "json").stdout)
    assert {j["name"] for j in mine} == {"owned"}
    by = json.loads(team.ok("reader", "job", "list", "-w", WS_A, "--user", "contributor",
                            "-o", "json").stdout)
    assert {j["name"] for j in by} == {"mine"} and all(j["created_by"] == "contributor"
                                                       for j in by)
    assert team.api("reader", "GET", f"/workspaces/{WS_A}/jobs",
                    params={"mine": "true"}).json() == []
    listed = team.cli("owner", "job", "list", "-w", WS_A).stdout
    assert "By" in listed and "contributor" in listed


def test_the_home_token_is_its_os_user_an_admin(team: Team) -> None:
    """The embedded default: no login, the home's token acts as the server's OS user, made
    an admin on first use; what it submits is recorded as that user's."""
    import getpass

    me = team.yard.js("whoami")
    assert me["name"] == getpass.getuser() and me["admin"] and me["credential"] == "home-token"
    users = {u["name"]: u for u in team.yard.js("user", "list")}
    assert users[getpass.getuser()]["admin"] is True
    team.yard.ok("job", "create", "-f", team.job_file("by-home", "true"), "-w", WS_A,
                 "-c", CLUSTER_A)
    assert team.api("admin", "GET", f"{JOBS_A}/by-home").json()["created_by"] == me["name"]
    team.yard.ok("job", "terminate", "by-home", "-w", WS_A)


@pytest.mark.parametrize("who", ["norole", "owner", "contributor", "reader"])
def test_no_role_in_b_means_nothing_of_b(team: Team, who: str) -> None:
    for path in (f"/workspaces/{WS_B}/jobs", f"{JOBS_B}/in-b", f"{JOBS_B}/in-b/logs",
                 f"{JOBS_B}/in-b/files", f"{JOBS_B}/in-b/files/content?path=stdouterr/x",
                 f"{JOBS_B}/no-such-job", f"/workspaces/{WS_B}", f"/workspaces/{WS_B}/clusters",
                 f"/workspaces/{WS_B}/datastores", "/workspaces/no-such-ws/jobs"):
        forbidden(team.api(who, "GET", path), "reader")  # never a 404 that tells
    names = {w["name"] for w in team.api(who, "GET", "/workspaces").json()}
    assert WS_B not in names and (WS_A in names) == (who != "norole")
    for args in (("job", "list", "-w", WS_B), ("job", "logs", "in-b", "-w", WS_B),
                 ("job", "file", "list", "-n", "in-b", "-w", WS_B)):
        run = team.cli(who, *args)
        assert run.rc == 5 and "reader" in run.stderr, str(run)
    # B's own owner sees it all
    assert team.cli("other_owner", "job", "list", "-w", WS_B).rc == 0


def test_the_audit_list_names_who_did_each(team: Team) -> None:
    rows = json.loads(team.ok("admin", "audit", "list", "--since", "1h", "-o", "json").stdout)
    seen = {(r["actor"], r["action"], r["outcome"]) for r in rows}
    assert ("owner", "job.submit", "ok") in seen
    assert ("contributor", "job.submit", "ok") in seen
    assert ("other_owner", "job.submit", "ok") in seen
    assert ("reader", "job.submit", "denied") in seen
    assert ("contributor", "job.terminate", "denied") in seen
    assert ("contributor", "job.terminate", "ok") in seen
    assert ("owner", "job.terminate", "ok") in seen
    assert ("norole", "read", "denied") in seen
    assert ("admin" not in {r["actor"] for r in rows})  # the home token acts as its OS user
    submit = next(r for r in rows if r["action"] == "job.submit" and r["actor"] == "owner")
    assert submit["target"] == "default/owned" and submit["workspace"] == WS_A
    assert submit["client"] == "127.0.0.1" and submit["credential"].startswith("token:")
    # never a secret
    text = json.dumps(rows)
    assert not any(token in text for token in [*team.tokens.values(), team.yard.token])
    # a workspace's owner reads its entries, not another's; readers read none
    own = json.loads(team.ok("owner", "audit", "list", "-w", WS_A, "--user", "contributor",
                             "-o", "json").stdout)
    assert own and {r["actor"] for r in own} == {"contributor"}
    assert {r["workspace"] for r in own} == {WS_A}
    assert team.cli("owner", "audit", "list", "-w", WS_B).rc == 5
    assert team.cli("owner", "audit", "list").rc == 5  # all of it: admins only
    assert team.cli("reader", "audit", "list", "-w", WS_A).rc == 5
    bad = team.cli("admin", "audit", "list", "--since", "last tuesday")
    assert bad.rc == 2 and "since" in bad.stderr, str(bad)


def test_a_job_token_acts_only_as_its_job(team: Team) -> None:
    token = job_token(team, "owned")
    assert team.api(None, "GET", f"{JOBS_A}/owned/metrics",
                    headers={"Authorization": f"Bearer {token}"}).status_code == 200
    as_job = {"Authorization": f"Bearer {token}"}
    # not its submitter's rights (the owner of A could do all of these)
    assert team.api(None, "GET", f"/workspaces/{WS_A}/jobs", headers=as_job).status_code == 401
    assert team.api(None, "POST", f"{JOBS_A}/owned/terminate",
                    headers=as_job).status_code == 401
    assert team.api(None, "GET", f"{JOBS_A}/mine/metrics", headers=as_job).status_code == 403


def test_the_last_owner_stays(team: Team) -> None:
    # the admin made the workspace, so owns it too: once they step back, owner is the last
    maker = json.loads(team.ok("admin", "whoami", "-o", "json").stdout)["name"]
    team.ok("owner", "role", "remove", "-w", WS_A, "--user", maker)
    run = team.cli("owner", "role", "remove", "-w", WS_A, "--user", "owner")
    assert run.rc == 2 and "last owner" in run.stderr, str(run)
    demote = team.cli("admin", "role", "assign", "-w", WS_A, "--user", "owner", "--role",
                      "reader")
    assert demote.rc == 2 and "last owner" in demote.stderr, str(demote)
    team.ok("owner", "role", "assign", "-w", WS_A, "--user", "norole", "--role", "owner")
    team.ok("owner", "role", "remove", "-w", WS_A, "--user", "norole")  # two owners: fine
    roles = json.loads(team.ok("reader", "role", "list", "-w", WS_A, "-o", "json").stdout)
    assert {(r["user"], r["role"]) for r in roles} == {
        ("owner", "owner"), ("contributor", "contributor"), ("reader", "reader")}


@pytest.mark.parametrize(("args", "rc", "named"), [
    (("role", "assign", "-w", WS_A, "--user", "nobody", "--role", "reader"), 3, "nobody"),
    (("role", "assign", "-w", WS_A, "--team", "noteam", "--role", "reader"), 3, "noteam"),
    (("role", "assign", "-w", WS_A, "--user", "reader", "--role", "superuser"), 2, "--role"),
    (("role", "assign", "-w", WS_A, "--role", "reader"), 2, "--user"),
    (("role", "assign", "-w", "no-such-ws", "--user", "reader", "--role", "reader"), 3,
     "no-such-ws"),
    (("token", "create", "--user", "nobody"), 3, "nobody"),
    (("token", "create", "--expires", "soon"), 2, "expires"),
    (("token", "revoke", "abc"), 2, "ID"),
    (("token", "revoke", "999999"), 3, "999999"),
    (("user", "disable", "nobody"), 3, "nobody"),
    (("user", "create", "bad name"), 2, "bad name"),
    (("team", "add", "noteam", "reader"), 3, "noteam"),
    (("job", "list", "-w", WS_A, "--mine", "--user", "x"), 2, "--mine"),
])
def test_bad_input_is_named(team: Team, args: tuple[str, ...], rc: int, named: str) -> None:
    run = team.cli("admin", *args)
    assert run.rc == rc, str(run)
    assert named in run.stderr and "Traceback" not in run.stderr, str(run)


def test_non_admins_cannot_manage_people(team: Team) -> None:
    for args in (("user", "create", "mallory"), ("user", "list"), ("user", "disable", "reader"),
                 ("team", "create", "t1"), ("token", "create", "--user", "reader"),
                 ("role", "assign", "-w", WS_A, "--user", "norole", "--role", "owner")):
        run = team.cli("contributor", *args)
        assert run.rc == 5, str(run)


def test_tokens_are_kept_hashed(team: Team) -> None:
    from sqlalchemy import select

    from batchyard.store.db import Database
    from batchyard.store.identity import ApiToken

    url = team.yard.env.get("BATCHYARD_DB_URL") or f"sqlite:///{team.yard.home}/batchyard.db"
    db = Database(url)
    try:
        with db.session() as s:
            rows = [tuple(str(v) for v in r) for r in s.execute(select(ApiToken.__table__))]
            hashes = set(s.scalars(select(ApiToken.token_hash)))
    finally:
        db.engine.dispose()
    for token in team.tokens.values():
        assert hashlib.sha256(token.encode()).hexdigest() in hashes
        assert not any(token in value or token[4:] in value for row in rows for value in row)


def test_revoked_expired_and_disabled_are_refused_at_once(team: Team) -> None:
    made = json.loads(team.ok("admin", "token", "create", "--user", "reader", "--expires",
                              "2s", "-o", "json").stdout)
    short = made["token"]
    env = {"BATCHYARD_TOKEN": short}
    assert team.yard.cli("job", "list", "-w", WS_A, env=env).rc == 0
    time.sleep(2.5)
    run = team.yard.cli("job", "list", "-w", WS_A, env=env)
    assert run.rc == 2 and "expired" in run.stderr, str(run)
    listed = json.loads(team.ok("reader", "token", "list", "-o", "json").stdout)
    assert {t["id"]: t["state"] for t in listed}[made["id"]] == "expired"
    assert all("token" not in t for t in listed)  # never the token itself
    fresh = json.loads(team.ok("admin", "token", "create", "--user", "reader", "-o",
                               "json").stdout)
    env = {"BATCHYARD_TOKEN": fresh["token"]}
    assert team.yard.cli("job", "list", "-w", WS_A, env=env).rc == 0
    team.ok("reader", "token", "revoke", str(fresh["id"]))  # one's own
    run = team.yard.cli("job", "list", "-w", WS_A, env=env)
    assert run.rc == 2 and "revoked" in run.stderr, str(run)
    # disabled: every token of the user at once, back when enabled
    team.ok("admin", "user", "disable", "reader")
    try:
        run = team.cli("reader", "job", "list", "-w", WS_A)
        assert run.rc == 2 and "disabled" in run.stderr, str(run)
        assert team.api("reader", "GET", "/health").status_code == 401
    finally:
        team.ok("admin", "user", "enable", "reader")
    assert team.cli("reader", "job", "list", "-w", WS_A).rc == 0
    # someone else's token: not found among one's own
    assert team.cli("norole", "token", "revoke", str(made["id"])).rc == 3


def test_login_logout_whoami(team: Team) -> None:
    yard = team.yard
    url = yard.url
    done = yard.cli("login", "--server", url, "--with-token", "-o", "json",
                    stdin=team.token("contributor") + "\n")
    assert done.rc == 0, str(done)
    assert done.json()["name"] == "contributor"
    stored = yard.home / "credentials"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert url in json.loads(stored.read_text())["servers"]
    me = yard.js("whoami")  # no BATCHYARD_TOKEN: the stored login
    assert me["name"] == "contributor" and not me["admin"]
    assert {(r["workspace"], r["role"]) for r in me["roles"]} == {(WS_A, "contributor")}
    assert yard.cli("job", "terminate", "owned", "-w", WS_A).rc == 5  # as the contributor
    assert yard.js("logout")["forgotten"] is True
    assert yard.js("whoami")["credential"] == "home-token"  # back to the embedded default
    assert json.loads(stored.read_text())["servers"] == {}
    # a service account never signs in interactively; a bad token is refused
    yard.ok("user", "create", "ci-bot", "--service")
    bot = yard.js("token", "create", "--user", "ci-bot")["token"]
    refused = yard.cli("login", "--server", url, "--with-token", stdin=bot + "\n")
    assert refused.rc == 5 and "service account" in refused.stderr, str(refused)
    assert yard.cli("whoami", env={"BATCHYARD_TOKEN": bot}).rc == 0  # its token works
    wrong = yard.cli("login", "--server", url, "--with-token", stdin="pat.wrong\n")
    assert wrong.rc == 2 and "invalid token" in wrong.stderr, str(wrong)
    rows = yard.js("audit", "list", "--user", "contributor", "--since", "1h")
    assert any(r["action"] == "auth.login" and r["outcome"] == "ok" for r in rows)


def test_root_jobs_need_an_admin(team: Team) -> None:
    body = {"name": "rooty", "vm_size": "Standard_D2_v2", "manual": {"target_node_count": 0},
            "allow_root_jobs": True}
    forbidden(team.api("owner", "POST", f"/workspaces/{WS_A}/clusters", json=body), "admin")
    assert "allow_root_jobs" in team.api("owner", "POST", f"/workspaces/{WS_A}/clusters",
                                         json=body).json()["error"]["message"]
    as_admin = team.api("admin", "POST", f"/workspaces/{WS_A}/clusters", json=body)
    assert as_admin.status_code not in (401, 403), as_admin.text  # 201 once the field exists
    if as_admin.status_code == 201:
        team.ok("admin", "cluster", "delete", "-n", "rooty", "-w", WS_A)


def test_failed_sign_ins_are_rate_limited(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A server of its own, with a limit of 5 failures in a 3 s window."""
    yard = Yard(tmp_path_factory.mktemp("rl-home"), tmp_path_factory.mktemp("rl-work"))
    yard.env.update(BATCHYARD_AUTH_FAILURES="5", BATCHYARD_AUTH_WINDOW="3")
    try:
        yard.start_server()
        good = {"Authorization": f"Bearer {yard.token}"}
        codes = [yard.http.get("/health", headers={"Authorization": f"Bearer pat.guess{i}"})
                 .status_code for i in range(7)]
        assert codes[:4] == [401] * 4 and codes[-1] == 429, codes
        blocked = yard.http.get("/health", headers=good)  # the address, whatever the token
        assert blocked.status_code == 429 and int(blocked.headers["Retry-After"]) >= 1
        assert "too many failed sign-ins" in blocked.json()["error"]["message"]
        wait_until(lambda: yard.http.get("/health", headers=good).status_code == 200, 10,
                   0.5, "the window to pass")
        rows = yard.js("audit", "list", "--action", "auth.failed")
        assert len(rows) >= 4 and {r["client"] for r in rows} == {"127.0.0.1"}
        assert not any("guess" in json.dumps(r) for r in rows)  # the tried tokens: not kept
        # a call without any token tries nothing: not counted, not blocked
        for _ in range(8):
            assert yard.http.get("/health", headers={"Authorization": ""}).status_code == 401
        assert yard.http.get("/health", headers=good).status_code == 200
    finally:
        yard.stop()


def test_the_server_never_takes_the_environments_token_as_its_own(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Regression: the admin token was read from BATCHYARD_TOKEN when set, so a server
    started with a user's personal token there made that token the admin's."""
    yard = Yard(tmp_path_factory.mktemp("env-home"), tmp_path_factory.mktemp("env-work"))
    yard.env["BATCHYARD_TOKEN"] = "pat.not-the-servers-own-token"
    try:
        yard.start_server()
        assert yard.token != "pat.not-the-servers-own-token"
        answer = yard.http.get("/health", headers={
            "Authorization": "Bearer pat.not-the-servers-own-token"})
        assert answer.status_code == 401, answer.text
    finally:
        yard.stop()
