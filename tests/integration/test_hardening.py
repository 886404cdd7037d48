"""Hardening, against a real server and real jobs on the local backend:

* a job that plants links in the server's copies of its logs and outputs (it shares the
  server's host) reads nothing through them: not the admin token, not /dev/zero, not a FIFO;
  and a follower's memory stays bounded however a rank writes (a ``\\r``-only progress bar,
  one endless line);
* downloads are attachments a browser never runs: a non-active type, nosniff, a sandbox CSP;
* bad input is a 4xx naming what was wrong, never a 5xx (numbers past 2**63, NUL bytes, lax
  types, path-like names);
* a job's token reaches only its own job, says nothing of others, and dies with its job; the
  home and the files in it are the owner's only.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import stat
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from yardkit import Yard, wait_until

pytestmark = pytest.mark.timeout(300)
BIG = 2**64
JOBS = "/workspaces/default/experiments/default/jobs"


def api(yard: Yard, method: str, path: str, token: str | None = None,
        **kw: Any) -> httpx.Response:
    """One request on a fresh connection (a 5xx may close a kept-alive one)."""
    headers = {"Authorization": f"Bearer {token or yard.token}", **kw.pop("headers", {})}
    return httpx.request(method, yard.url + "/api/v1" + path, headers=headers, timeout=30,
                         **kw)


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def portal(yard: Yard) -> httpx.Client:
    client = httpx.Client(base_url=yard.url, timeout=60)
    resp = client.post("/login", data={"token": yard.token, "next": "/"},
                       headers={"Origin": yard.url})
    assert resp.status_code == 303, resp.text
    return client


def submit(yard: Yard, name: str, spec: dict[str, Any], cluster: str) -> None:
    path = yard.write_job(name, {"name": name, **spec})
    yard.ok("job", "create", "-f", str(path), "-c", cluster)


def server_dir_of(yard: Yard, name: str) -> str:
    """The shell expression of the server's attempt dir, as a rank on the local backend can
    work it out (the server's home is on its own host)."""
    return (f'"$YARD/workspaces/default/experiments/default/jobs/{name}/'
            '${BATCHYARD_PROC_TAG%%/*}"')


# --- 8: links in the server's copies, bounded followers --------------------------------------


@pytest.fixture(scope="module")
def open_node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server whose local nodes run jobs without the rank sandbox (BATCHYARD_SANDBOX=off, a
    node operator's choice): its jobs can reach the server's copies of their files, as every
    job could before the sandbox, so the server's own defences below are still tried."""
    y = Yard(tmp_path_factory.mktemp("home"), tmp_path_factory.mktemp("work"))
    y.env["BATCHYARD_SANDBOX"] = "off"
    try:
        y.start_server()
        y.ok("cluster", "create", "-n", "open2", "-s", "Standard_D2_v2", "-t", "2")
        y.wait_cluster("open2", 2)
        yield y
    finally:
        y.stop()

PLANT = """
D={dir}
echo start
until [ -d "$D/stdouterr" ]; do sleep 0.05; done
L="$D/stdouterr/$BATCHYARD_NODE_NAME"
ln -s "$YARD/token" "$L-rank7.stdout.txt"
ln "$YARD/token" "$L-rank6.stdout.txt"
ln -s /dev/zero "$L-rank5.stdout.txt"
mkfifo "$L-rank4.stdout.txt"
mkdir -p "$D/outputs/RESULT"
ln -s "$YARD" "$D/outputs/HOME"
ln -s "$YARD" "$D/outputs/RESULT/home"
ln -s "$YARD/token" "$D/outputs/RESULT/token.txt"
echo weights > "$BATCHYARD_OUTPUT_RESULT/model.txt"
echo planted
"""


def test_links_a_job_plants_in_the_servers_copies_are_not_followed(open_node: Yard) -> None:
    yard, cluster2 = open_node, "open2"
    name = "planted"
    submit(yard, name, {"command": PLANT.format(dir=server_dir_of(yard, name)),
                        "env": {"YARD": str(yard.home)}, "outputs": {"RESULT": {}}}, cluster2)
    job = yard.wait_job(name, timeout=90)
    assert job["state"] == "succeeded", job
    before = rss(yard.server_pid)
    for query in ({"rank": 7}, {"rank": 6}, {"rank": 5}, {"rank": 4}, {}):
        started = time.monotonic()
        resp = api(yard, "GET", f"{JOBS}/{name}/logs", params=query)
        assert resp.status_code == 200, resp.text
        assert yard.token not in resp.text and "\0" not in resp.text, query
        assert time.monotonic() - started < 10, query  # /dev/zero, a FIFO: no endless read
    assert "planted" in api(yard, "GET", f"{JOBS}/{name}/logs").text
    cli = yard.ok("job", "logs", "-n", name, "--rank", "7")
    assert yard.token not in cli.stdout + cli.stderr
    listed = [f["path"] for f in api(yard, "GET", f"{JOBS}/{name}/files").json()["files"]]
    assert "outputs/RESULT/model.txt" in listed, listed
    assert not [p for p in listed if "rank4" in p or "rank5" in p or "rank6" in p
                or "rank7" in p or "HOME" in p or "home" in p or "token" in p], listed
    for rel in ("stdouterr/{n}-rank7.stdout.txt", "stdouterr/{n}-rank6.stdout.txt",
                "stdouterr/{n}-rank5.stdout.txt", "stdouterr/{n}-rank4.stdout.txt",
                "outputs/HOME/token", "outputs/RESULT/home/token", "outputs/RESULT/token.txt"):
        node = job["attempts"][-1]["nodes"][0]["node"]
        resp = api(yard, "GET", f"{JOBS}/{name}/files/content",
                   params={"path": rel.format(n=node)})
        assert resp.status_code == 404, (rel, resp.status_code, resp.text[:200])
        assert yard.token not in resp.text
    model = api(yard, "GET", f"{JOBS}/{name}/files/content",
                params={"path": "outputs/RESULT/model.txt"})
    assert model.status_code == 200 and model.text == "weights\n"
    with contextlib.closing(portal(yard)) as web:
        events = web.get(f"/portal/api/ws/default/exp/default/jobs/{name}/logs")
        assert "planted" in events.text and yard.token not in events.text
    assert rss(yard.server_pid) - before < 64 * 2**20


def test_a_rank_log_linked_on_the_node_does_not_ship_its_target(yard: Yard,
                                                               cluster2: str) -> None:
    name = "node-link"
    submit(yard, name, {"command": 'ln -s "$YARD/token" '
                        '"$AZ_BATCHAI_STDOUTERR_DIR/$BATCHYARD_NODE_NAME-rank7.stdout.txt"; '
                        "sleep 1", "env": {"YARD": str(yard.home)}}, cluster2)
    assert yard.wait_job(name, timeout=60)["state"] == "succeeded"
    out = yard.ok("job", "logs", "-n", name, "--rank", "7")
    assert yard.token not in out.stdout


WRITE_THROUGH = """
D={dir}
until [ -d "$D/stdouterr" ]; do sleep 0.05; done
ln -s "$VICTIM/by-append-logs" "$D/stdouterr/evil.txt"
mkdir -p "$D/outputs"
ln -s "$VICTIM" "$D/outputs/RESULT"
sleep 0.5
echo "written through a link" > "$AZ_BATCHAI_STDOUTERR_DIR/evil.txt"
echo payload > "$BATCHYARD_OUTPUT_RESULT/by-put-output"
sleep 1
"""


def test_the_server_never_writes_through_a_link_a_job_planted(open_node: Yard,
                                                              tmp_path: Path) -> None:
    yard, cluster2 = open_node, "open2"
    name = "write-through"
    victim = tmp_path / "victim"
    victim.mkdir()
    submit(yard, name, {"command": WRITE_THROUGH.format(dir=server_dir_of(yard, name)),
                        "env": {"YARD": str(yard.home), "VICTIM": str(victim)},
                        "outputs": {"RESULT": {}}}, cluster2)
    yard.wait_job(name, timeout=60)
    assert sorted(p.name for p in victim.iterdir()) == []


def test_followers_memory_stays_bounded(yard: Yard, cluster2: str) -> None:
    """A 64 MB progress bar redrawn with ``\\r`` only and a 32 MB line with no end at all,
    followed by two portal viewers and two `job logs -f`: the server does not hold them."""
    name = "bar"
    marker = yard.work / "bar.done"
    submit(yard, name, {"command": 'echo start; until [ -e "$MARK" ]; do sleep 0.1; done',
                        "env": {"MARK": str(marker)}}, cluster2)
    job = yard.wait_job(name, ("running",), timeout=60)
    logs = yard.attempt_dir(job) / "stdouterr"
    wait_until(lambda: logs.is_dir(), 30, what="the server's log copy")
    node = wait_until(lambda: (n := yard.job(name)["attempts"][-1]["nodes"]) and n[0]["node"],
                      30, what="the node's report")
    step = b"  42%|" + b"#" * 180 + b"| 420/1000\r"
    (logs / f"{node}-rank5.stdout.txt").write_bytes(step * (64 * 2**20 // len(step)))
    (logs / f"{node}-rank6.stdout.txt").write_bytes(b"x" * (32 * 2**20))
    pid = yard.server_pid
    base = rss(pid)
    got: dict[str, int] = {}
    errors: list[BaseException] = []

    def read(label: str, url: str, client: httpx.Client) -> None:
        try:
            with client.stream("GET", url, timeout=120) as resp:
                assert resp.status_code == 200, resp.status_code
                for chunk in resp.iter_bytes():
                    got[label] = got.get(label, 0) + len(chunk)
        except BaseException as exc:  # reported below
            errors.append(exc)

    web = portal(yard)
    cli = httpx.Client(base_url=yard.url + "/api/v1",
                       headers={"Authorization": f"Bearer {yard.token}"})
    readers = [threading.Thread(target=read, args=(
        f"portal{i}", f"/portal/api/ws/default/exp/default/jobs/{name}/logs", web))
        for i in range(2)] + [threading.Thread(target=read, args=(
            f"api{i}", f"{JOBS}/{name}/logs?follow=true", cli)) for i in range(2)]
    for t in readers:
        t.start()
    peak = base
    everything = 64 * 2**20 + 32 * 2**20
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and not (
            len(got) == 4 and all(v >= everything for v in got.values())):
        peak = max(peak, rss(pid))
        time.sleep(0.05)
    marker.touch()
    for t in readers:
        t.join(60)
    web.close()
    cli.close()
    assert not errors, errors
    assert len(got) == 4 and all(v >= everything for v in got.values()), got
    assert peak - base < 64 * 2**20, f"server grew by {(peak - base) >> 20} MiB"
    assert yard.wait_job(name, timeout=60)["state"] == "succeeded"


# --- 11: downloads never run in the portal's origin ----------------------------------------

ACTIVE = {"page.html": "<html><script>alert(document.cookie)</script></html>",
          "pic.svg": '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
          "app.js": "alert(1)", "notes.txt": "plain text\n", "data.bin": "\x01\x02"}


def assert_inert(resp: httpx.Response, text: bool) -> None:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == ("text/plain; charset=utf-8" if text
                                            else "application/octet-stream"), resp.headers
    assert resp.headers["x-content-type-options"] == "nosniff"
    assert resp.headers["content-security-policy"] == "sandbox; default-src 'none'"
    assert resp.headers["content-disposition"].startswith("attachment"), resp.headers


def test_downloads_are_inert_attachments(yard: Yard, cluster2: str, tmp_path: Path) -> None:
    name = "active"
    writes = "; ".join(f"printf %s {shlex.quote(body)} > \"$BATCHYARD_OUTPUT_WEB/{fname}\""
                       for fname, body in ACTIVE.items())
    submit(yard, name, {"command": writes, "outputs": {"WEB": {}}}, cluster2)
    assert yard.wait_job(name, timeout=60)["state"] == "succeeded"
    with contextlib.closing(portal(yard)) as web:
        for fname, body in ACTIVE.items():
            params = {"path": f"outputs/WEB/{fname}"}
            resp = api(yard, "GET", f"{JOBS}/{name}/files/content", params=params)
            assert_inert(resp, fname.endswith(".txt"))
            assert resp.content == body.encode()
            assert resp.headers["content-length"] == str(len(body.encode()))
            assert f'filename="{fname}"' in resp.headers["content-disposition"]
            from_portal = web.get(f"/portal/api/ws/default/exp/default/jobs/{name}"
                                  "/files/content", params=params)
            assert from_portal.status_code == 200 and from_portal.content == body.encode()
    log = api(yard, "GET", f"{JOBS}/{name}/files", params={}).json()["files"]
    first = next(f["path"] for f in log if f["path"].startswith("stdouterr/"))
    assert_inert(api(yard, "GET", f"{JOBS}/{name}/files/content", params={"path": first}),
                 True)
    # a datastore's files, and a setup task's output
    store = tmp_path / "store"
    store.mkdir()
    assert api(yard, "POST", "/workspaces/default/datastores",
               json={"name": "pages", "kind": "local", "path": str(store)}).status_code == 201
    assert api(yard, "PUT", "/workspaces/default/datastores/pages/files/x/page.html",
               content=ACTIVE["page.html"]).status_code == 200
    assert_inert(api(yard, "GET", "/workspaces/default/datastores/pages/files/x/page.html"),
                 False)
    yard.ok("cluster", "create", "-n", "setup1", "-s", "Standard_D2_v2", "-t", "1",
            "--setup-task", "echo '<script>alert(1)</script>'")
    yard.wait_cluster("setup1", 1, timeout=60)
    found = api(yard, "GET", "/workspaces/default/clusters/setup1/files").json()
    assert found, found
    resp = api(yard, "GET", "/workspaces/default/clusters/setup1/files/content",
               params={"path": found[0]["path"]})
    assert_inert(resp, found[0]["path"].endswith(".txt"))
    assert api(yard, "DELETE", "/workspaces/default/clusters/setup1").status_code == 204


def test_portal_downloads_are_inert_attachments(yard: Yard, cluster2: str) -> None:
    name = "active-portal"
    submit(yard, name, {"command": "printf %s '<script>alert(1)</script>' > "
                        '"$BATCHYARD_OUTPUT_WEB/page.html"', "outputs": {"WEB": {}}}, cluster2)
    assert yard.wait_job(name, timeout=60)["state"] == "succeeded"
    with contextlib.closing(portal(yard)) as web:
        assert_inert(web.get(f"/portal/api/ws/default/exp/default/jobs/{name}/files/content",
                             params={"path": "outputs/WEB/page.html"}), False)


# --- 12: bad input is a 4xx naming it -------------------------------------------------------

EXEC = "/workspaces/default/clusters/local2/nodes/local2-0/exec"
PROBE = f"{JOBS}/probe"
SUBMIT = "/workspaces/default/jobs"
BAD: list[tuple[str, str, str, dict[str, Any], str]] = [
    ("quota-gpus", "PUT", "/workspaces/default/quotas",
     {"json": {"family": "standardNCFamily", "gpus": BIG}}, "gpus"),
    ("quota-vcpus", "PUT", "/workspaces/default/quotas",
     {"json": {"family": "standardNCFamily", "vcpus": BIG}}, "vcpus"),
    ("metric-rank", "POST", PROBE + "/metrics",
     {"json": {"metrics": [{"name": "m", "value": 1, "rank": BIG}]}}, "metrics[0].rank"),
    ("metric-step", "POST", PROBE + "/metrics",
     {"json": {"metrics": [{"name": "m", "value": 1, "step": BIG}]}}, "metrics[0].step"),
    ("metric-attempt", "POST", PROBE + "/metrics",
     {"json": {"metrics": [{"name": "m", "value": 1, "attempt": BIG}]}},
     "metrics[0].attempt"),
    ("metric-value", "POST", PROBE + "/metrics",
     {"json": {"metrics": [{"name": "m", "value": 10**400}]}}, "metrics[0].value"),
    ("metric-ts-inf", "POST", PROBE + "/metrics",
     {"content": '{"metrics": [{"name": "m", "value": 1, "ts": 1e999}]}',
      "headers": {"content-type": "application/json"}}, "metrics[0].ts"),
    ("metric-ts-far", "POST", PROBE + "/metrics",  # finite, but no client's ms fit it
     {"json": {"metrics": [{"name": "m", "value": 1, "ts": 1e300}]}}, "metrics[0].ts"),
    ("token-id", "DELETE", f"/tokens/{BIG}", {}, "token_id"),  # PostgreSQL: a 500 before
    ("metrics-attempt", "GET", PROBE + "/metrics", {"params": {"attempt": BIG}}, "attempt"),
    ("metrics-after", "GET", PROBE + "/metrics", {"params": {"after": BIG}}, "after"),
    ("files-attempt", "GET", PROBE + "/files", {"params": {"attempt": BIG}}, "attempt"),
    ("download-attempt", "GET", PROBE + "/files/content",
     {"params": {"path": "stdouterr/x", "attempt": BIG}}, "attempt"),
    ("logs-attempt", "GET", PROBE + "/logs", {"params": {"attempt": BIG}}, "attempt"),
    ("logs-rank", "GET", PROBE + "/logs", {"params": {"rank": BIG}}, "rank"),
    ("exec-empty", "POST", EXEC, {"json": {"argv": [""]}}, "argv"),
    ("exec-nul", "POST", EXEC, {"json": {"argv": ["ec\0ho", "hi"]}}, "argv"),
    ("exec-nul-arg", "POST", EXEC, {"json": {"argv": ["echo", "a\0b"]}}, "argv"),
    ("exec-a-directory", "POST", EXEC, {"json": {"argv": ["/"]}}, "argv[0]"),
    ("ray-address", "POST", "/workspaces/default/clusters",
     {"json": {"name": "r1", "backend": "ray", "address": "\u00a4"}}, "address"),
    ("setup-task-nul", "POST", "/workspaces/default/clusters",
     {"json": {"name": "s1", "setup_task": {"command": "echo \0"}}}, "setup_task.command"),
    ("setup-task-env-nul", "POST", "/workspaces/default/clusters",
     {"json": {"name": "s2", "setup_task": {"command": "true", "env": {"A": "\0"}}}},
     "setup_task.env"),
    ("autoscale-idle-inf", "POST", "/workspaces/default/clusters/local2/autoscale",
     {"content": '{"min_nodes": 0, "max_nodes": 2, "idle_seconds_before_scaledown": 1e999}',
      "headers": {"content-type": "application/json"}}, "idle_seconds_before_scaledown"),
    ("workspace-location", "POST", "/workspaces",
     {"json": {"name": "w1", "location": "x" * 5_000_000}}, "location"),
]
SPECS: list[tuple[str, dict[str, Any], str]] = [
    ("command-nul", {"command": "echo \0"}, "command"),
    ("argv-nul", {"command": ["echo", "\0"]}, "command"),
    ("env-nul", {"command": "true", "env": {"A": "x\0y"}}, "env"),
    ("prepare-nul", {"command": "true", "prepare": "\0"}, "prepare"),
    ("nodes-true", {"command": "true", "nodes": True}, "nodes"),
    ("env-list", {"command": "true", "env": {"A": [1, 2]}}, "env"),
    ("description-10mb", {"command": "true", "description": "d" * 10_000_000},
     "description"),
    ("parameter-servers-2**64", {"command": "true", "distribution": {
        "type": "tensorflow", "parameter_server_count": BIG}},
     "distribution.parameter_server_count"),
    ("wall-clock-nan", {"command": "true", "limits": {"max_wall_clock": "NaN"}},
     "limits.max_wall_clock"),
]
NAMES: list[tuple[str, dict[str, Any], str]] = [
    ("experiment", {"experiment": "../.."}, "experiment"),
    ("cluster", {"cluster": "../.."}, "cluster"),
    ("name", {"name": "../.."}, "name"),
    ("name-slash", {"name": "a/b"}, "name"),
]


@pytest.fixture(scope="module")
def probe(yard: Yard, cluster2: str) -> str:
    submit(yard, "probe", {"command": "echo hi"}, cluster2)
    yard.wait_job("probe", timeout=60)
    return "probe"


def assert_names(resp: httpx.Response, field: str) -> None:
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:300])
    error = resp.json()["error"]
    assert error["code"] != "internal"
    fields = [d.get("field", "") for d in error.get("details") or []]
    assert any(f.startswith(field) for f in fields) or error["message"].startswith(field) \
        or f"{field}:" in error["message"], (field, error)


@pytest.mark.parametrize(("method", "path", "kw", "field"),
                         [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_naming_it(yard: Yard, cluster2: str, probe: str, method: str,
                                      path: str, kw: dict[str, Any], field: str) -> None:
    assert_names(api(yard, method, path, **kw), field)


@pytest.mark.parametrize("after", [2**31, 2**40, 2**63 - 1])
def test_a_metrics_cursor_past_any_id_is_an_empty_page(yard: Yard, cluster2: str, probe: str,
                                                      after: int) -> None:
    """Ids are 32-bit on PostgreSQL: a bigger ``after`` overflowed there (a 500, found by
    the schemathesis pass on PostgreSQL in CI); no value can come after it."""
    resp = api(yard, "GET", PROBE + "/metrics", params={"after": after})
    assert resp.status_code == 200 and resp.json() == [], resp.text[:300]


def test_a_cursor_past_2_63_is_a_4xx(yard: Yard, cluster2: str) -> None:
    cursor = base64.urlsafe_b64encode(f"j1:{BIG}".encode()).decode().rstrip("=")
    assert_names(api(yard, "GET", "/workspaces/default/jobs", params={"cursor": cursor}),
                 "cursor")


@pytest.mark.parametrize(("spec", "field"), [s[1:] for s in SPECS], ids=[s[0] for s in SPECS])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "submit"])
def test_bad_job_specs_are_refused_at_submit(yard: Yard, cluster2: str, spec: dict[str, Any],
                                             field: str, dry_run: bool) -> None:
    resp = api(yard, "POST", SUBMIT, json={"spec": spec, "cluster": cluster2,
                                           "dry_run": dry_run})
    assert resp.status_code == 422, (resp.status_code, resp.text[:300])
    assert f"job spec: {field}" in resp.json()["error"]["message"], resp.text[:300]


def test_a_command_over_the_os_limits_is_refused_at_submit(yard: Yard, cluster2: str) -> None:
    """Issue 33, item 9: a 30 MB command was accepted (in 36 s) and failed at launch with
    E2BIG. It is a 422 naming the field, at once; the CLI says so too (exit 2), and no job
    was made."""
    started = time.monotonic()
    resp = api(yard, "POST", SUBMIT, json={"spec": {"name": "huge", "command": "x" * (
        30 * 1024 * 1024)}, "cluster": cluster2})
    assert resp.status_code == 422, (resp.status_code, resp.text[:300])
    assert resp.json()["error"]["message"].startswith("job spec: command: 30.0 MiB")
    assert time.monotonic() - started < 20
    path = yard.write_job("wide-env", {"name": "wide-env", "command": "true",
                                       "env": {"BLOB": "y" * 200_000}})
    res = yard.cli("job", "create", "-f", str(path), "-c", cluster2)
    assert res.rc == 2 and "env.BLOB" in res.stderr, str(res)
    assert "Traceback" not in res.stderr
    assert api(yard, "GET", f"{JOBS}/huge").status_code == 404
    assert api(yard, "GET", f"{JOBS}/wide-env").status_code == 404


@pytest.mark.parametrize(("given", "field"), [n[1:] for n in NAMES], ids=[n[0] for n in NAMES])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "submit"])
def test_path_like_names_are_refused_naming_the_argument(
        yard: Yard, cluster2: str, given: dict[str, Any], field: str, dry_run: bool) -> None:
    body = {"spec": {"command": "true"}, "cluster": cluster2, "dry_run": dry_run, **given}
    assert_names(api(yard, "POST", SUBMIT, json=body), field)


@pytest.mark.parametrize(("segment", "named"), [("%2E%2E", "'..'"), ("%00", "'\\x00'"),
                                               ("..%2F..", None), ("a%2Fb", None)])
def test_path_like_names_in_urls_are_a_404(yard: Yard, cluster2: str, segment: str,
                                          named: str | None) -> None:
    """A name that reaches a route is a 404 naming it; one with an encoded '/' matches no
    route at all (Starlette decodes it first): a plain 404, never a 5xx."""
    for path in (f"/workspaces/{segment}/clusters", f"/workspaces/{segment}/jobs",
                 f"/workspaces/default/experiments/{segment}/jobs/x",
                 f"/workspaces/default/experiments/default/jobs/{segment}/files"):
        resp = api(yard, "GET", path)
        assert resp.status_code == 404, (path, resp.status_code, resp.text)
        if named is not None:
            error = resp.json()["error"]
            assert error["code"] == "not_found" and named in error["message"], (path, error)


@pytest.mark.parametrize("args", [("cluster", "list", "-w", "../.."),
                                  ("cluster", "show", "-n", "../.."),
                                  ("job", "show", "-n", "x", "-w", "../.."),
                                  ("job", "wait", "-n", "../..")],
                         ids=["cluster-list-w", "cluster-show-n", "job-show-w", "job-wait-n"])
def test_cli_path_like_names_name_the_argument(yard: Yard, cluster2: str,
                                               args: tuple[str, ...]) -> None:
    result = yard.cli(*args, timeout=60)
    assert result.rc == 2 and "Traceback" not in result.stderr, str(result)
    assert "../.." in result.stdout + result.stderr, str(result)


# --- 13: job tokens, private files ----------------------------------------------------------

def test_a_job_token_reaches_only_its_own_job_and_dies_with_it(yard: Yard, cluster2: str,
                                                               probe: str) -> None:
    name = "tok"
    marker = yard.work / "tok.done"
    submit(yard, name, {"command": 'echo "T=$BATCHYARD_TOKEN"; until [ -e "$MARK" ]; do '
                        "sleep 0.1; done", "env": {"MARK": str(marker)}}, cluster2)
    yard.wait_job(name, ("running",), timeout=60)
    text = wait_until(lambda: "T=job." in (t := api(yard, "GET", f"{JOBS}/{name}/logs").text)
                      and t, 30, what="the job's token in its log")
    token = text.split("T=", 1)[1].split()[0]
    assert api(yard, "GET", f"{JOBS}/{name}/metrics", token=token).status_code == 200
    assert api(yard, "POST", f"{JOBS}/{name}/metrics", token=token,
               json={"metrics": [{"name": "loss", "value": 0.5}]}).status_code == 201
    answers = []
    for other in (f"{JOBS}/{probe}", f"{JOBS}/no-such-job",
                  "/workspaces/default/experiments/no-such-exp/jobs/x",
                  "/workspaces/no-such-ws/experiments/default/jobs/x"):
        for method, suffix in (("GET", "/metrics"), ("GET", "/tags"), ("POST", "/tags")):
            resp = api(yard, method, other + suffix, token=token,
                       **({"json": {"tags": {"a": "b"}}} if method == "POST" else {}))
            answers.append((resp.status_code, resp.json()))
    assert len(set(json.dumps(a, sort_keys=True) for a in answers)) == 1, answers
    assert answers[0][0] == 403, answers
    assert api(yard, "GET", f"{JOBS}/{name}", token=token).status_code == 401  # admin only
    marker.touch()
    assert yard.wait_job(name, timeout=60)["state"] == "succeeded"
    ended = api(yard, "GET", f"{JOBS}/{name}/metrics", token=token)
    assert ended.status_code == 401, ended.text
    assert "ended" in ended.json()["error"]["message"]
    assert api(yard, "GET", f"{JOBS}/{name}/metrics").status_code == 200  # admin: still


def test_a_home_batchyard_creates_is_its_owners_only(tmp_path: Path) -> None:
    fresh = Yard(tmp_path / "not-yet" / "home", tmp_path)
    try:
        fresh.start_server()
        assert fresh.http.get("/workspaces").status_code == 200  # the database is written
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in fresh.home.iterdir()
                 if p.is_file()}
        assert stat.S_IMODE(fresh.home.stat().st_mode) == 0o700
        on_file = "BATCHYARD_DB_URL" not in fresh.env  # PostgreSQL keeps no file here
        for fname in ("token", *(("batchyard.db",) if on_file else ()), "server.log",
                      "server.json"):
            assert modes.get(fname) == 0o600, (fname, oct(modes.get(fname) or 0), modes)
        for fname, mode in modes.items():
            assert not mode & 0o077, (fname, oct(mode))
    finally:
        fresh.stop()
    assert os.path.isdir(fresh.home)
