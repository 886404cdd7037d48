"""Chaos (issue 16): four clusters in two workspaces, long jobs running on three of them, and
kill -9 of random node launchers and ranks of jobs on the fourth, twenty times over. Every
job on the other clusters succeeds with its logs and outputs whole, every killed job ends
naming the node (and the rank) that was killed, no process of any job is left, and the
server stays healthy.

The victims are submitted up front over the API and queue on the chaos cluster; each is
killed once it runs (after a random moment), so 1-node victims also run two at once there
and a kill in one must not touch its neighbour. A random quarter may retry (max_retries 1):
their first attempt is the killed one, their second ends at once. The seed is printed and
in every failure message; ``BATCHYARD_CHAOS_SEED=N`` replays a run's choices."""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import pytest

from yardkit import TERMINAL, Yard, pid_alive, tagged_pids, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

KILLS = 20
CHAOS = ("wsb", "cx", 2)
OTHERS = (("wsa", "ca", 1), ("wsa", "cb", 2), ("wsb", "cc", 1))
SURVIVOR = ('r=${RANK:-0}; echo "rank $r up"; until [ -e "$GO" ]; do sleep 0.5; done; '
            'echo "rank $r survived"; echo "rank $r" > "$AZ_BATCHAI_OUTPUT_MODEL/rank$r.txt"')
LONG = "sleep 300"
FIRST_ONLY = 'if [ "$BATCHYARD_ATTEMPT" = 1 ]; then sleep 300; fi'


def _submit(yard: Yard, ws: str, cluster: str, name: str, spec: dict[str, Any]) -> None:
    resp = yard.http.post(f"/workspaces/{ws}/jobs", json={
        "spec": spec, "experiment": "chaos", "name": name, "cluster": cluster})
    assert resp.status_code == 201, resp.text


def _job(yard: Yard, ws: str, name: str) -> dict[str, Any]:
    return yard.job(name, "chaos", ws)


def _running(yard: Yard, ws: str, name: str, nodes: int, ranks: int, early: bool = False
             ) -> list[dict[str, Any]] | None:
    """The job's node reports once every launcher and every rank has reported its pid
    (``early``: once some launcher has, in whatever state it is)."""
    job = _job(yard, ws, name)
    if job["state"] in TERMINAL:
        raise AssertionError(f"{name} ended before it was killed: {job['state']} "
                             f"{job.get('message')}")
    if len(job["attempts"]) != 1:
        return None
    reports = yard.node_reports(job)
    if early:
        return [r for r in reports if r.get("pid") and r.get("node")] or None
    if job["state"] != "running":
        return None
    ready = [r for r in reports if r.get("pid")
             and len([x for x in r.get("ranks") or [] if x["rank"] >= 0 and x.get("pid")])
             == ranks // nodes]
    return reports if len(reports) == nodes and len(ready) == nodes else None


def test_chaos_kills_on_one_cluster(yard: Yard) -> None:
    seed = int(os.environ.get("BATCHYARD_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    print(f"chaos seed {seed} (BATCHYARD_CHAOS_SEED={seed} replays it)")
    rng = random.Random(seed)
    started = time.monotonic()
    for ws in sorted({w for w, _, _ in (*OTHERS, CHAOS)}):
        yard.ok("workspace", "create", "-n", ws)
    for ws, cluster, nodes in (*OTHERS, CHAOS):
        yard.ok("cluster", "create", "-n", cluster, "-w", ws, "-s", "Standard_D2_v2", "-t",
                str(nodes))
    for ws, cluster, nodes in (*OTHERS, CHAOS):
        yard.wait_cluster(cluster, nodes, workspace=ws, timeout=90)

    go = yard.work / "chaos.go"
    survivors: list[tuple[str, str, int]] = []
    for ws, cluster, nodes in OTHERS:
        name = f"keep-{cluster}"
        spec: dict[str, Any] = {"command": SURVIVOR, "env": {"GO": str(go)},
                                "outputs": {"MODEL": {}}, "nodes": nodes}
        if nodes > 1:
            spec["distribution"] = {"type": "pytorch", "processes_per_node": 1}
        _submit(yard, ws, cluster, name, spec)
        survivors.append((ws, name, nodes))

    victims: list[dict[str, Any]] = []
    ws, cluster, size = CHAOS
    for i in range(KILLS):
        nodes = rng.choice((1, size))
        ppn = rng.choice((1, 2))
        retry = rng.random() < 0.25
        spec = {"nodes": nodes, "command": FIRST_ONLY if retry else LONG,
                "distribution": {"type": "pytorch", "processes_per_node": ppn},
                "limits": {"grace_period": 1,
                           **({"max_retries": 1, "retry_exit_codes": [137]} if retry else {})}}
        name = f"victim-{i:02d}"
        _submit(yard, ws, cluster, name, spec)
        victims.append({"name": name, "nodes": nodes, "ranks": nodes * ppn, "retry": retry})

    def survivors_up() -> bool:
        return all(_running(yard, w, n, k, k) for w, n, k in survivors)

    wait_until(survivors_up, 120, 0.2, f"the survivor jobs to run (seed {seed})")
    keep_pids = {n: yard.recorded_pids(_job(yard, w, n)) for w, n, _ in survivors}

    for victim in victims:  # one kill each, as soon as (and a random moment after) it runs
        name = victim["name"]
        launcher = rng.random() < 0.5
        early = launcher and rng.random() < 0.3  # while it prepares (or just got running)
        reports = wait_until(lambda v=victim, e=early: _running(yard, ws, v["name"], v["nodes"],
                                                                v["ranks"], e),
                             120, 0.02 if early else 0.1, f"{name} to run (seed {seed})")
        if not early:
            time.sleep(rng.uniform(0.0, 1.0))
        report = rng.choice(reports)
        ranks = [r for r in report.get("ranks") or [] if r["rank"] >= 0]
        victim["pids"] = [int(r["pid"]) for r in reports] + [
            int(x["pid"]) for r in reports for x in r.get("ranks") or [] if x.get("pid")]
        victim["uuid"] = _job(yard, ws, name)["attempts"][0]["uuid"]
        victim["node"] = report["node"]
        if launcher:
            victim["kill"] = "launcher" + (f" ({report.get('state')})" if early else "")
            os.kill(int(report["pid"]), signal.SIGKILL)
        else:
            target = rng.choice(ranks)
            victim["kill"], victim["rank"] = "rank", int(target["rank"])
            os.kill(int(target["pid"]), signal.SIGKILL)
        print(f"{time.monotonic() - started:6.1f}s {name} ({victim['nodes']} node(s), "
              f"{victim['ranks']} rank(s){', retry' if victim['retry'] else ''}): kill -9 "
              f"{victim['kill']} {victim.get('rank', '')} on {victim['node']}", flush=True)

    problems = []
    for victim in victims:
        name = victim["name"]
        job = yard.wait_job(name, timeout=90, experiment="chaos", workspace=ws)
        first = job["attempts"][0]
        error = first.get("error") or {}
        said = f"{name} ({victim['nodes']} node(s), {victim['kill']} {victim.get('rank', '')}" \
               f" on {victim['node']}): " \
               f"{job['state']}, attempts {[a['state'] for a in job['attempts']]}, " \
               f"attempt 1: {first.get('message')!r} {error}"
        retried = victim["retry"] and len(job["attempts"]) == 2
        if retried:
            if job["state"] != "succeeded":
                problems.append(f"retried but its second attempt did not succeed: {said}")
        elif job["state"] != "failed" or victim["retry"]:
            problems.append(f"expected failed{' then retried' if victim['retry'] else ''}: "
                            f"{said}")
        message = first.get("message") or ""
        if victim["kill"].startswith("launcher"):
            if (error.get("cause"), error.get("node")) != ("node lost", victim["node"]) \
                    or victim["node"] not in message:
                problems.append(f"does not name the lost node: {said}")
        else:
            if (error.get("rank"), error.get("node"), error.get("exit_code")) \
                    != (victim["rank"], victim["node"], 137) \
                    or f"rank {victim['rank']} on node {victim['node']}" not in message:
                problems.append(f"does not name the killed rank: {said}")
        if not retried and (job.get("error") or {}).get("node") != victim["node"]:
            problems.append(f"the job's own error names another node: {said} {job['error']}")
        print("   ", said[:300], flush=True)

    # no process of any victim is left (the killed attempt's too, by pid and by its tag)
    for victim in victims:
        job = _job(yard, ws, victim["name"])
        try:
            if len(yard.recorded_pids(job) + victim["pids"]) >= 2:
                yard.assert_no_process_left(job, extra_pids=victim["pids"], timeout=10)
            wait_until(lambda v=victim: not tagged_pids(v["uuid"]) and not any(
                pid_alive(p) for p in v["pids"]), 10, 0.1, "the killed attempt's processes")
        except AssertionError as exc:
            problems.append(f"{victim['name']}: {exc}")

    # the other clusters' jobs ran on untouched, and end well with their logs and outputs
    for w, n, _ in survivors:
        job = _job(yard, w, n)
        if job["state"] != "running" or len(job["attempts"]) != 1 \
                or not all(pid_alive(p) for p in keep_pids[n]):
            problems.append(f"survivor {n} was touched: {job['state']} {job.get('message')}, "
                            f"{len(job['attempts'])} attempt(s), pids {keep_pids[n]}")
    go.touch()
    for w, n, k in survivors:
        job = yard.wait_job(n, timeout=90, experiment="chaos", workspace=w)
        if job["state"] != "succeeded":
            problems.append(f"survivor {n} ended {job['state']}: {job.get('message')}")
            continue
        logs = yard.ok("job", "logs", "-n", n, "-e", "chaos", "-w", w).stdout
        outputs = yard.attempt_dir(job) / "outputs" / "MODEL"
        for r in range(k):
            if f"rank {r} up" not in logs or f"rank {r} survived" not in logs:
                problems.append(f"survivor {n}: rank {r}'s log lines are missing:\n{logs}")
            out = outputs / f"rank{r}.txt"
            if not out.is_file() or out.read_text().strip() != f"rank {r}":
                problems.append(f"survivor {n}: rank {r}'s output is missing or wrong")
        try:
            yard.assert_no_process_left(job)
        except AssertionError as exc:
            problems.append(f"survivor {n}: {exc}")

    health = yard.http.get("/health")
    if health.status_code != 200 or health.json().get("pid") != yard.server_pid \
            or not pid_alive(yard.server_pid):
        problems.append(f"the server is not healthy: {health.status_code} {health.text}")
    listed = yard.js("job", "list", "-w", ws, "-e", "chaos", "-c", cluster)
    if len(listed) != KILLS:
        problems.append(f"job list shows {len(listed)} victims, not {KILLS}")
    assert not problems, f"seed {seed}:\n" + "\n".join(problems)
    print(f"chaos seed {seed}: {KILLS} kills in {time.monotonic() - started:.0f}s")
