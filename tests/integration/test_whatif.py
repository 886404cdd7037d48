"""Start-time estimates and `job create --what-if` on a real server (issue 35 §4).

A 2-node cluster runs two jobs with known wall clocks (600 s and 1200 s); a 1-node cluster
of the same workspace runs one of 900 s. A queued 2-node job's estimate is when the longer
of the two ends; a what-if of a 2-node job comes after it, with 1 node it fits in the hole
the shorter job leaves, and a long 1-node job is told the other cluster is sooner.
Nothing a what-if asks is stored; bad input is refused as `job create` refuses it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from yardkit import Yard

pytestmark = pytest.mark.timeout(300)
WS, TWO, SPARE = "wi", "two", "spare"
TOL = 2.0


def _spec(nodes: int, wall: int | None, command: str = "sleep 5") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodes": nodes, "distribution": {"type": "custom"},
                            "command": command}
    if wall is not None:
        spec["limits"] = {"max_wall_clock": wall}
    return spec


def _submit(yard: Yard, name: str, cluster: str, spec: dict[str, Any]) -> None:
    resp = yard.http.post(f"/workspaces/{WS}/jobs",
                          json={"spec": spec, "cluster": cluster, "name": name})
    assert resp.status_code == 201, resp.text


def _job(yard: Yard, name: str) -> dict[str, Any]:
    return yard.job(name, workspace=WS)


@pytest.fixture(scope="module")
def busy(yard: Yard) -> dict[str, float]:
    """The running jobs' ends (epoch seconds) once all three run."""
    yard.ok("workspace", "create", WS)
    yard.ok("cluster", "create", "-n", TWO, "-w", WS, "-s", "Standard_D2_v2", "-t", "2")
    yard.ok("cluster", "create", "-n", SPARE, "-w", WS, "-s", "Standard_D2_v2", "-t", "1")
    yard.wait_cluster(TWO, 2, workspace=WS)
    yard.wait_cluster(SPARE, 1, workspace=WS)
    _submit(yard, "short", TWO, _spec(1, 600, "sleep 600"))
    _submit(yard, "long", TWO, _spec(1, 1200, "sleep 1200"))
    _submit(yard, "hog", SPARE, _spec(1, 900, "sleep 900"))
    ends = {}
    for name, wall in (("short", 600), ("long", 1200), ("hog", 900)):
        job = yard.wait_job(name, ("running",), timeout=120, workspace=WS)
        ends[name] = float(job["started_at"]) + wall
    return ends


def test_queued_job_shows_its_estimated_start(yard: Yard, busy: dict[str, float]) -> None:
    _submit(yard, "next", TWO, _spec(2, 300))
    job = yard.wait_job("next", ("queued",), workspace=WS)
    assert job["estimated_start"] is not None
    assert abs(job["estimated_start"] - busy["long"]) < TOL, job["estimate"]
    assert job["estimate"]["ahead"] == 0
    shown = yard.js("job", "show", "next", "-w", WS)
    assert abs(shown["estimated_start"] - busy["long"]) < TOL
    table = yard.ok("job", "show", "next", "-w", WS).stdout
    assert "Estimated start" in table and "0 job(s) ahead" in table, table
    running = _job(yard, "long")
    assert "estimated_start" not in running  # only a queued job has one


def test_what_if_answers_and_suggests_fewer_nodes(yard: Yard, busy: dict[str, float]) -> None:
    before = len(yard.http.get(f"/workspaces/{WS}/jobs").json())
    path = yard.write_job("wi2", {**_spec(2, 100), "name": "wi2"})
    answer = yard.js("job", "create", "-f", str(path), "-w", WS, "-c", TWO, "--what-if")
    # behind `next` (2 nodes, 300 s from when `long` ends)
    assert answer["cluster"] == TWO and answer["nodes"] == 2
    assert abs(answer["estimated_start"] - (busy["long"] + 300)) < TOL, answer
    assert answer["ahead"] == 1
    fewer = [o for o in answer["sooner"] if o["cluster"] == TWO and o["nodes"] == 1]
    # one node fits for 100 s in the hole `short` leaves before `next` starts
    assert fewer and abs(fewer[0]["estimated_start"] - busy["short"]) < TOL, answer
    assert all(o["cluster"] != SPARE for o in answer["sooner"])  # 2 nodes never fit there
    assert len(yard.http.get(f"/workspaces/{WS}/jobs").json()) == before  # nothing stored
    words = yard.ok("job", "create", "-f", str(path), "-w", WS, "-c", TWO, "--what-if").stdout
    assert "nothing was submitted" in words and "Sooner" in words, words


def test_what_if_suggests_another_cluster(yard: Yard, busy: dict[str, float]) -> None:
    # 1 node for 1000 s: too long for the hole on `two`, so after `next`; `spare` frees first
    answer = yard.ok("job", "create", "-w", WS, "-c", TWO, "--what-if", "--set",
                     "limits.max_wall_clock=1000", "-o", "json", "--", "sleep", "1").json()
    assert abs(answer["estimated_start"] - (busy["long"] + 300)) < TOL, answer
    spare = [o for o in answer["sooner"] if o["cluster"] == SPARE]
    assert spare and abs(spare[0]["estimated_start"] - busy["hog"]) < TOL, answer
    assert spare[0]["nodes"] == 1


def test_what_if_over_http(yard: Yard, busy: dict[str, float]) -> None:
    resp = yard.http.post(f"/workspaces/{WS}/jobs/what-if",
                          json={"spec": _spec(1, 60), "cluster": SPARE})
    assert resp.status_code == 200, resp.text
    assert abs(resp.json()["estimated_start"] - busy["hog"]) < TOL
    nowall = yard.http.post(f"/workspaces/{WS}/jobs/what-if",
                            json={"spec": _spec(1, None), "cluster": SPARE}).json()
    assert any("wall-clock" in n for n in nowall["notes"]), nowall
    array = yard.http.post(f"/workspaces/{WS}/jobs/what-if",
                           json={"spec": {**_spec(1, 60), "array": "0-3"}, "cluster": SPARE})
    assert array.status_code == 200 and any("job array" in n for n in array.json()["notes"])
    assert not any(j["name"].startswith("job-") for j in
                   yard.http.get(f"/workspaces/{WS}/jobs").json())  # nothing made


@pytest.mark.parametrize("args, field", [
    (("--nodes", "3"), "nodes"),
    (("--set", "limits.max_wall_clock=-5"), "max_wall_clock"),
    (("--priority", "urgent"), "priority"),
])
def test_bad_what_if_is_refused(yard: Yard, busy: dict[str, float], args: tuple[str, ...],
                                field: str) -> None:
    path = yard.write_job("bad", {**_spec(1, 60), "name": "bad"})
    result = yard.cli("job", "create", "-f", str(path), "-w", WS, "-c", TWO, *args,
                      "--what-if")
    assert result.rc == 2, str(result)
    assert field in result.stderr + result.stdout, str(result)
    assert "Traceback" not in result.stderr


def test_refused_json_what_if_is_said_by_the_whole_cli(yard: Yard,
                                                       busy: dict[str, float]) -> None:
    """`-f F --what-if -o json` goes the quick path; refused, the whole CLI says why."""
    path = yard.write_job("toobig", {**_spec(3, 60), "name": "toobig"})
    result = yard.cli("job", "create", "-f", str(path), "-w", WS, "-c", TWO, "--what-if",
                      "-o", "json")
    assert result.rc == 2, str(result)
    assert "nodes" in result.stderr and "Traceback" not in result.stderr


def test_unknown_cluster_is_refused_as_create_refuses_it(yard: Yard,
                                                         busy: dict[str, float]) -> None:
    path = yard.write_job("bad", {**_spec(1, 60), "name": "bad"})
    asked = yard.cli("job", "create", "-f", str(path), "-w", WS, "-c", "nosuch", "--what-if")
    created = yard.cli("job", "create", "-f", str(path), "-w", WS, "-c", "nosuch")
    assert asked.rc == created.rc != 0 and asked.stderr == created.stderr, str(asked)
    assert "nosuch" in asked.stderr


def test_bad_what_if_over_http_is_422(yard: Yard, busy: dict[str, float]) -> None:
    for spec in ({"nodes": 0, "command": "x"}, {"nodes": 1, "command": "x", "bogus": 1}):
        resp = yard.http.post(f"/workspaces/{WS}/jobs/what-if",
                              json={"spec": spec, "cluster": TWO})
        assert resp.status_code == 422, resp.text
    anonymous = httpx.post(f"{yard.url}/api/v1/workspaces/{WS}/jobs/what-if", timeout=30,
                           json={"spec": _spec(1, 60), "cluster": TWO})
    assert anonymous.status_code == 401
