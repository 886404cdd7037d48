"""The job's 'GPUs idle' event (server/services/gpu_usage.py), on a real SQLite store through
the node channel's report path: once per idle spell, only when every node of the gang that
holds GPUs is idle, with the mean over its GPUs and the window in the message; a spell that
ends and comes back is a new event. The settings come from the server's environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from batchyard.server.services import channel, gpu_usage
from batchyard.store.db import Database
from batchyard.store.models import (
    Attempt,
    Cluster,
    Event,
    Experiment,
    Job,
    Node,
    NodeReport,
    Workspace,
)


@pytest.fixture
def db(tmp_path: Path) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    db.migrate()
    with db.session() as s:
        ws = Workspace(name="default")
        s.add(ws)
        s.flush()
        exp = Experiment(workspace_id=ws.id, name="e")
        c = Cluster(workspace_id=ws.id, name="c", backend="local", spec={}, size={})
        s.add_all([exp, c])
        s.flush()
        nodes = [Node(cluster_id=c.id, name=f"c-{i}", index=i, address="127.0.0.1",
                      state="running", resources={"gpus": 2, "gpu_ids": [0, 1]},
                      directory="/x") for i in range(2)]
        s.add_all(nodes)
        s.flush()
        job = Job(workspace_id=ws.id, experiment_id=exp.id, cluster_id=c.id, name="j",
                  spec={}, state="running", directory="/x")
        s.add(job)
        s.flush()
        attempt = Attempt(job_id=job.id, number=1, uuid="u", state="running",
                          node_ids=[n.id for n in nodes], directory="/x/u")
        s.add(attempt)
        s.flush()
        for rank, node in enumerate(nodes):
            s.add(NodeReport(attempt_id=attempt.id, node_rank=rank, node_id=node.id,
                             token_hash="x", seq=0, state="running", data={}))
    return db


def status(node: str, idle_since: float | None, mean: float = 3.0,
           gpus: int = 2) -> dict[str, Any]:
    idle = {"since": idle_since, "mean": mean, "window": 900.0, "percent": 10.0} \
        if idle_since is not None else None
    return {"state": "running", "node": node,
            "gpu": {"gpus": {str(i): {"mean": mean, "p10": 1, "samples": 9}
                             for i in range(gpus)}, "idle": idle}}


class Reports:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.seq = [0, 0]

    def send(self, rank: int, data: dict[str, Any]) -> None:
        self.seq[rank] += 1
        with self.db.session() as s:
            channel.apply_report(s, "u", rank, self.seq[rank], data)

    def events(self) -> list[str]:
        with self.db.session() as s:
            return [str(e.message) for e in s.scalars(
                select(Event).where(Event.to_state == gpu_usage.IDLE_EVENT).order_by(Event.id))]


def test_every_node_idle_then_one_event_per_spell(db: Database) -> None:
    reports = Reports(db)
    reports.send(0, status("c-0", 100.0, mean=2.0))
    assert reports.events() == []  # nothing heard of node 1's GPUs yet
    reports.send(0, status("c-0", 101.0, mean=2.0))
    assert reports.events() == []
    reports.send(1, status("c-1", None))
    assert reports.events() == []  # node 1's GPUs work
    reports.send(1, status("c-1", 160.0, mean=4.0))
    assert reports.events() == ["GPUs idle: 3 % over 15 min"]
    for _ in range(3):  # the same spells, reported again: nothing new
        reports.send(0, status("c-0", 101.0, mean=2.0))
        reports.send(1, status("c-1", 160.0, mean=4.0))
    assert len(reports.events()) == 1
    reports.send(0, status("c-0", None))  # node 0's GPUs wake up ...
    reports.send(0, status("c-0", 2000.0, mean=1.0))  # ... and fall idle again
    assert reports.events()[1:] == ["GPUs idle: 2 % over 15 min"]


def test_a_node_without_gpus_does_not_hold_it_back(db: Database) -> None:
    with db.session() as s:
        s.scalars(select(Node).where(Node.name == "c-1")).one().resources = {"gpus": 0}
    reports = Reports(db)
    reports.send(1, {"state": "running", "node": "c-1"})
    reports.send(0, status("c-0", 50.0, mean=0.4))
    assert reports.events() == ["GPUs idle: 0 % over 15 min"]


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHYARD_GPU_IDLE_PERCENT", "25")
    monkeypatch.setenv("BATCHYARD_GPU_IDLE_MINUTES", "0.5")
    monkeypatch.setenv("BATCHYARD_GPU_SAMPLE_SECONDS", "nonsense")
    settings = gpu_usage.observe_settings()
    assert settings["idle_percent"] == 25.0 and settings["idle_seconds"] == 30.0
    assert settings["interval"] == 5.0  # an unusable value: the default
    assert gpu_usage.idle_message(3.2, 30.0) == "GPUs idle: 3 % over 30 s"
