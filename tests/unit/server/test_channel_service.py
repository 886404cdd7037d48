"""The node channel's exactly-once rules, on a real SQLite store (no server, no fakes):
log chunks are appended only at the copy's end, reports are applied at most once and in
order, a failing node aborts the gang, a rendezvous completes only when every node has
published, and relay execs are routed to the named node and answered from its reports."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from batchyard.errors import AuthError, SpecError
from batchyard.server.context import ServerContext
from batchyard.server.services import channel
from batchyard.store.db import Database
from batchyard.store.models import (
    Attempt,
    Cluster,
    Experiment,
    Job,
    Node,
    NodeReport,
    Workspace,
)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[ServerContext, str]:
    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    db.migrate()
    ctx = ServerContext(db=db, admin_token="admin-secret", api_url="http://127.0.0.1:1")
    with db.session() as s:
        ws = Workspace(name="default")
        s.add(ws)
        s.flush()
        c = Cluster(workspace_id=ws.id, name="c", backend="local", spec={}, size={"vcpus": 2},
                    target_nodes=2)
        s.add(c)
        exp = Experiment(workspace_id=ws.id, name="default")
        s.add(exp)
        s.flush()
        nodes = [Node(cluster_id=c.id, name=f"c-{i}", index=i, address="127.0.0.1",
                      state="running", resources={"cpus": 2}, directory=str(tmp_path / f"n{i}"))
                 for i in range(2)]
        s.add_all(nodes)
        s.flush()
        job = Job(workspace_id=ws.id, experiment_id=exp.id, cluster_id=c.id, name="j",
                  spec={"nodes": 2, "command": "true", "outputs": {"OUT": {}}},
                  directory=str(tmp_path / "job"))
        s.add(job)
        s.flush()
        attempt = Attempt(job_id=job.id, number=1, uuid="u-1", state="running",
                          node_ids=[n.id for n in nodes], handle={"node_names": ["c-0", "c-1"]},
                          directory=str(tmp_path / "job" / "u-1"))
        s.add(attempt)
        s.flush()
        for rank, node in enumerate(nodes):
            s.add(NodeReport(attempt_id=attempt.id, node_rank=rank, node_id=node.id,
                             token_hash="x", seq=0, state="starting", data={}))
    return ctx, "u-1"


def chunk(offset: int, data: bytes) -> list[object]:
    return [offset, base64.b64encode(data).decode()]


def test_logs_are_appended_exactly_once(setup: tuple[ServerContext, str]) -> None:
    ctx, uuid = setup
    with ctx.db.session() as s:
        assert channel.append_logs(s, uuid, {"n-rank0.stdout.txt": chunk(0, b"a\nb\n")}) == \
            {"n-rank0.stdout.txt": 4}
        # a resend of the same chunk (the reply was lost) changes nothing
        assert channel.append_logs(s, uuid, {"n-rank0.stdout.txt": chunk(0, b"a\nb\n")}) == \
            {"n-rank0.stdout.txt": 4}
        # a gap is refused: the reply says where the copy ends, so the node resends from there
        assert channel.append_logs(s, uuid, {"n-rank0.stdout.txt": chunk(9, b"zz")}) == \
            {"n-rank0.stdout.txt": 4}
        channel.append_logs(s, uuid, {"n-rank0.stdout.txt": chunk(4, b"c\n")})
        attempt = s.query(Attempt).one()
    copy = Path(attempt.directory) / "stdouterr" / "n-rank0.stdout.txt"
    assert copy.read_bytes() == b"a\nb\nc\n"


@pytest.mark.parametrize("name", ["../x", ".hidden", "a/b", "x" * 300])
def test_log_names_cannot_leave_the_copy(setup: tuple[ServerContext, str], name: str) -> None:
    ctx, uuid = setup
    with ctx.db.session() as s, pytest.raises(SpecError):
        channel.append_logs(s, uuid, {name: chunk(0, b"x")})


def test_reports_apply_at_most_once_and_a_failure_aborts_the_gang(
        setup: tuple[ServerContext, str]) -> None:
    ctx, uuid = setup
    with ctx.db.session() as s:
        channel.apply_report(s, uuid, 0, 2, {"state": "running"})
        stale = channel.apply_report(s, uuid, 0, 1, {"state": "preparing"})
        assert stale["seq"] == 2
        reply = channel.apply_report(s, uuid, 1, 1, {"state": "failed", "node": "c-1",
                                                     "failed_rank": 1, "exit_code": 3,
                                                     "message": "rank 1 on node c-1 exited "
                                                                "with code 3"})
        assert reply["control"]["abort"]["rank"] == 1
        rows = {r.node_rank: r for r in s.query(NodeReport)}
        assert rows[0].state == "running"  # the older report did not win
        # a report after the end is acknowledged but not applied
        late = channel.apply_report(s, uuid, 1, 7, {"state": "running"})
        assert late["seq"] == 7 and rows[1].state == "failed"
        version, control = channel.control_of(s, uuid, 0)
    assert version >= 1 and control["abort"]["exit_code"] == 3


def test_rendezvous_completes_when_every_node_published(
        setup: tuple[ServerContext, str]) -> None:
    ctx, uuid = setup
    with ctx.db.session() as s:
        channel.publish_ports(s, uuid, 1, [2001])
        assert channel.rendezvous_of(s, uuid)["complete"] is False
        for bad in ([], [0], [70000]):
            with pytest.raises(SpecError):
                channel.publish_ports(s, uuid, 0, bad)
        channel.publish_ports(s, uuid, 0, [1001])
        channel.publish_ports(s, uuid, 0, [9999])  # a resend: the first answer stands
        assert channel.rendezvous_of(s, uuid) == {"complete": True, "ports": [[1001], [2001]]}


def test_relay_goes_to_the_named_node_and_answers_from_its_reports(
        setup: tuple[ServerContext, str]) -> None:
    ctx, uuid = setup
    with ctx.db.session() as s:
        started = channel.relay(s, uuid, "c-1", "orted --x")
        assert started["node_rank"] == 1
        _, control = channel.control_of(s, uuid, 1)
        assert [e["command"] for e in control["execs"]["1"]] == ["orted --x"]
        assert channel.relay_result(s, uuid, started["id"]) == {"done": False}
        channel.apply_report(s, uuid, 1, 1, {"state": "running",
                                             "execs": {started["id"]: 0}})
        assert channel.relay_result(s, uuid, started["id"]) == {"done": True, "exit_code": 0}


def test_launcher_credentials_act_for_one_node_only(setup: tuple[ServerContext, str]) -> None:
    ctx, uuid = setup
    token = channel.launch_token(ctx, uuid, 0)
    channel.check_launcher(ctx, token, uuid, 0)
    with pytest.raises(channel.Forbidden):
        channel.check_launcher(ctx, token, uuid, 1)
    with pytest.raises(AuthError):
        channel.check_launcher(ctx, token[:-2] + "xx", uuid, 0)
    with pytest.raises(AuthError):
        channel.check_launcher(ctx, channel.job_token(ctx, 1, uuid), uuid, 0)


def test_outputs_stay_inside_their_output(setup: tuple[ServerContext, str]) -> None:
    ctx, uuid = setup
    with ctx.db.session() as s:
        channel.put_output(s, uuid, "OUT/model/w.bin", b"123", None)
        for bad in ("OUT/../../etc/passwd", "NOPE/x", "OUT/"):
            with pytest.raises(SpecError):
                channel.put_output(s, uuid, bad, b"x", None)
        with pytest.raises(SpecError):
            channel.put_output(s, uuid, "OUT/y", b"x", "0" * 64)
        attempt = s.query(Attempt).one()
    assert (Path(attempt.directory) / "outputs" / "OUT" / "model" / "w.bin").read_bytes() == \
        b"123"


def test_the_fast_path_appends_exactly_once_and_never_through_a_link(
        setup: tuple[ServerContext, str], tmp_path: Path) -> None:
    """log_chunks.append_known (a batch appended on the event loop, for an attempt this
    process already wrote for) keeps the full path's rules: only at the copy's end, and a
    link planted in the copy takes nothing and is never followed."""
    from batchyard.server.services import log_chunks

    ctx, uuid = setup
    assert log_chunks.append_known("u-unknown", {"a.txt": chunk(0, b"x")}) is None
    with ctx.db.session() as s:
        channel.append_logs(s, uuid, {"n-rank0.stdout.txt": chunk(0, b"a\n")})
        attempt = s.query(Attempt).one()
    root = Path(attempt.directory) / "stdouterr"
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"secret\n")
    (root / "n-rank1.stdout.txt").symlink_to(outside)
    assert log_chunks.append_known(uuid, {"n-rank0.stdout.txt": chunk(2, b"b\n")}) == \
        {"n-rank0.stdout.txt": 4}
    assert log_chunks.append_known(uuid, {"n-rank0.stdout.txt": chunk(2, b"b\n")}) == \
        {"n-rank0.stdout.txt": 4}  # a resend changes nothing
    assert log_chunks.append_known(uuid, {"n-rank1.stdout.txt": chunk(7, b"more\n")}) == \
        {"n-rank1.stdout.txt": 12}  # acknowledged, so the node stops resending it
    assert (root / "n-rank0.stdout.txt").read_bytes() == b"a\nb\n"
    assert outside.read_bytes() == b"secret\n"
    with pytest.raises(SpecError):
        log_chunks.append_known(uuid, {"../x": chunk(0, b"x")})


def test_a_launch_made_again_may_have_been_submitted(setup: tuple[ServerContext, str]) -> None:
    """The first launch of an attempt hands the gang over at once; a launch of the same
    attempt again (a server killed between sbatch and the commit of its answer) is told the
    gang may be in the backend's queue already, so a queueing backend looks before it
    submits; a new attempt of the job is a first launch again."""
    ctx, _ = setup
    with ctx.db.session() as s:
        attempt = s.query(Attempt).one()
        assert channel.prepare_launch(ctx, s, attempt).maybe_submitted is False
    with ctx.db.session() as s:
        attempt = s.query(Attempt).one()
        assert channel.prepare_launch(ctx, s, attempt).maybe_submitted is True
        second = Attempt(job_id=attempt.job_id, number=2, uuid="u-2", state="launching",
                         node_ids=list(attempt.node_ids), handle=None,
                         directory=attempt.directory + "-2")
        s.add(second)
        s.flush()
        assert channel.prepare_launch(ctx, s, second).maybe_submitted is False
