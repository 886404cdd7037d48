"""A heartbeat answers the launchers its node should run from the active attempts, and reads
only its own as whole objects: a busy fleet's heartbeats (hundreds a second, each looking at
every active attempt) spent most of the server's time building attempts of other nodes
(bench/fleet_sim.py, py-spy)."""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import event

from batchyard.server.context import ServerContext
from batchyard.server.services import agents, clusters, jobs
from batchyard.spec.cluster import ClusterSpec
from batchyard.spec.job import JobSpec
from batchyard.store.db import Database
from batchyard.store.models import Attempt, Job, Node

NODES = 30


def test_a_heartbeat_builds_only_its_own_attempts(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    db.migrate()
    ctx = ServerContext(db=db, admin_token="bench")
    with db.session() as s:
        clusters.create(s, "default", ClusterSpec.model_validate({
            "name": "fleet", "backend": "machines", "vm_size": "Standard_D2_v2",
            "manual": {"target_node_count": 0}}))
    with db.session() as s:
        token = agents.create_join_token(s, "default", "fleet", None)["token"]
    for i in range(NODES):
        with db.session() as s:
            agents.join(s, {"join_token": token, "machine_id": uuid.uuid4().hex,
                            "hostname": f"m{i}", "name": f"m{i}", "address": "127.0.0.1",
                            "work_dir": f"/w/m{i}", "resources": {"cpus": 2}})
    with db.session() as s:
        node_ids = [n.id for n in s.query(Node).order_by(Node.index)]
    for i, node_id in enumerate(node_ids):  # one running attempt per node
        with db.session() as s:
            jobs.submit(ctx, s, "default", JobSpec.model_validate(
                {"name": f"j{i}", "command": "true"}), cluster="fleet")
        with db.session() as s:
            job = s.query(Job).filter_by(name=f"j{i}").one()
            s.add(Attempt(job_id=job.id, number=1, uuid=str(uuid.uuid4()), state="running",
                          node_ids=[node_id], handle={"backend": "machines"},
                          directory=str(tmp_path / f"a{i}")))
    built: list[int] = []

    def note(target: Attempt, _ctx: object) -> None:
        built.append(target.node_ids[0])

    event.listen(Attempt, "load", note)
    try:
        with db.session() as s:
            node = s.get(Node, node_ids[7])
            assert node is not None
            reply = agents.heartbeat(ctx, s, node, {"launchers": []})
    finally:
        event.remove(Attempt, "load", note)
    assert [w["node_rank"] for w in reply["run"]] == [0]
    assert len(reply["run"]) == 1 and reply["run"][0]["attempt_dir"].endswith(
        reply["run"][0]["attempt"])
    assert built == [node_ids[7]], f"built {len(built)} attempts of other nodes"
