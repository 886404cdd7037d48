"""A random sweep of 8 trials, at most 2 at a time, on a 2-node local cluster: each trial is a
2-node x 1-process PyTorch DDP job (``examples/sweep-ddp``) logging ``val_accuracy`` every
epoch. Learning rates far below 1e-3 barely learn, and the Bandit policy stops such trials
early (they end ``canceled`` saying so); the best run is reported. In the middle the server
is killed with SIGKILL and started again: afterwards the sweep has exactly its 8 trials,
each of which ran exactly once (one attempt, each rank started once)."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from yardkit import Yard, pid_alive, wait_until

pytestmark = [pytest.mark.timeout(420), pytest.mark.torch]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sweep-ddp"
MARK = 'echo "$BATCHYARD_JOB_NAME $RANK $BATCHYARD_ATTEMPT" >> "$MARKS/starts.txt" && '


def sweep(yard: Yard, name: str) -> dict[str, Any]:
    resp = yard.http.get(f"/workspaces/default/experiments/default/sweeps/{name}")
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def copy_example(yard: Yard, tag: str) -> Path:
    target = yard.work / f"sweep-ddp-{tag}"
    shutil.copytree(EXAMPLE, target, dirs_exist_ok=True)
    return target


def at_most_at_once(trials: list[dict[str, Any]], limit: int) -> None:
    """No trial was made while `limit` others had been made and had not ended."""
    for t in trials:
        alive = [o for o in trials if o["index"] != t["index"]
                 and o["created_at"] < t["created_at"]
                 and (o["ended_at"] is None or o["ended_at"] > t["created_at"])]
        assert len(alive) < limit, (t["index"], [o["index"] for o in alive])


@pytest.mark.slow
def test_random_sweep_of_ddp_trials_survives_kill_9(yard: Yard, cluster2: str,
                                                    tmp_path: Path) -> None:
    marks, mount = yard.exchange("marks")  # each trial's ranks write there
    folder = copy_example(yard, "native")
    spec = yaml.safe_load((folder / "sweep.yaml").read_text())
    spec["command"] = MARK + spec["command"]
    spec["env"] = {"MARKS": str(marks)}
    spec["mounts"] = [mount]
    (folder / "sweep-test.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    made = yard.js("sweep", "create", "-f", str(folder / "sweep-test.yaml"), "-c", cluster2)
    assert made["name"] == "lr-sweep" and made["state"] == "running", made

    wait_until(lambda: sweep(yard, "lr-sweep")["trials_created"] >= 3, 150, 0.2,
               "the sweep to make its third trial")
    old_pid, old_url = yard.server_pid, yard.url
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(old_pid), 10, what="the server to die")
    yard.start_server(port=int(old_url.rsplit(":", 1)[1]))

    wait_until(lambda: sweep(yard, "lr-sweep")["state"] != "running", 300, 0.5,
               "the sweep to end")
    done = sweep(yard, "lr-sweep")
    assert done["state"] == "succeeded", done
    trials = done["trials"]
    assert sorted(t["index"] for t in trials) == list(range(8)), trials
    assert len({t["name"] for t in trials}) == 8
    at_most_at_once(trials, 2)
    starts = [line.split() for line in (marks / "starts.txt").read_text().splitlines()]
    for t in trials:  # every trial ran once: one attempt, each of its 2 ranks started once
        job = yard.job(t["name"])
        assert job["nodes"] == 2 and job["processes_per_node"] == 1
        assert [a["number"] for a in job["attempts"]] == [1], job
        ranks = sorted(s[1] for s in starts if s[0] == t["name"])
        assert ranks == ["0", "1"], (t["name"], ranks)
        assert job["state"] in ("succeeded", "canceled"), job
    stopped = [t for t in trials if t["state"] == "canceled"]
    assert stopped, f"the bandit stopped no trial: {trials}"
    for t in stopped:
        job = yard.job(t["name"])
        assert job["message"].startswith("stopped early by the bandit policy at step "), job
    finished = [t for t in trials if t["state"] == "succeeded"]
    best = max(finished, key=lambda t: t["objective"])
    # the poor learning rates were among those stopped, and nothing stopped beat the best
    assert any(t["params"]["lr"] < 1e-3 for t in stopped), trials
    assert all(t["objective"] is None or t["objective"] < best["objective"] for t in stopped)
    assert done["best"]["name"] == best["name"] and best["objective"] > 0.9, done["best"]
    assert f"best {best['name']} with val_accuracy" in done["message"]
    # the CLI: trials sorted by objective, best first, and the JSON form
    shown = yard.js("sweep", "show", "lr-sweep")
    objectives = [t["objective"] for t in shown["trials"] if t["objective"] is not None]
    assert objectives == sorted(objectives, reverse=True)
    table = yard.ok("sweep", "show", "lr-sweep").stdout
    assert table.index(best["name"]) < table.index(stopped[0]["name"]), table
    assert "stopped early by the bandit policy" in table
    listed = yard.js("sweep", "list")
    assert [s["name"] for s in listed] == ["lr-sweep"] and listed[0]["state"] == "succeeded"
