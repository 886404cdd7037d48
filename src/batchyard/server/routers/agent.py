"""Routes of `batchyard agent` (join, heartbeat, command results) and the admin's join
tokens. An agent authenticates with its join token once, then with its own node credential,
which acts for its own node only."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from batchyard.server import notify
from batchyard.server.auth import context
from batchyard.server.context import ServerContext
from batchyard.server.routers.deps import INT32_MAX, CommitRoute, session
from batchyard.server.security.permissions import InWorkspace, NodeAgent, Public
from batchyard.server.security.principal import Role
from batchyard.server.services import agents
from batchyard.store.models import Node

# CommitRoute: a join commits in its own worker thread; with the dependency's commit, 100
# agents joining at once took every worker thread waiting for the write lock that the first
# join held, and it could not get a thread to commit (tests/integration/test_agent_scale.py)
router = APIRouter(tags=["agents"], route_class=CommitRoute)


class JoinIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    join_token: str = Field(min_length=1, max_length=200)
    machine_id: str = Field(min_length=8, max_length=64)
    hostname: str = Field(min_length=1, max_length=255)
    name: str | None = Field(None, max_length=64)
    address: str = Field(min_length=1, max_length=64)
    work_dir: str = Field(min_length=1, max_length=4096)
    resources: dict[str, Any] = Field(default_factory=dict)
    version: str | None = None


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    launchers: list[dict[str, Any]] = Field(default_factory=list)
    resources: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    # the machine's container runtime and cached images ({} when it has none)
    containers: dict[str, Any] | None = None
    # a periodic health check the agent finished (node/healthcheck.py)
    health: dict[str, Any] | None = None
    checking: bool = False  # a health check is under way: not asked for again


class ResultIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    exit_code: int
    stdout: str = ""
    stderr: str = ""


class JoinTokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl: float | None = Field(None, description="Seconds the token stays valid (default 24h).")


@router.post("/agent/join", dependencies=[Depends(Public(
    "the join token in the body is the credential (services.agents.join checks it)"))])
def join(body: JoinIn, s: Session = Depends(session)) -> dict[str, Any]:
    return agents.join(s, body.model_dump())


# The rule of an agent's routes: its node credential, for its own node; it answers the
# node's id (read in a session of its own, closed before a long poll waits).
agent_node_id = NodeAgent()


def agent_node(node_id: int = Depends(agent_node_id), s: Session = Depends(session)) -> Node:
    """The node, in the route's session (a caller without a valid node credential got
    401/403 before its body was looked at)."""
    row = s.get(Node, node_id)
    assert row is not None
    return row


@router.post("/agent/nodes/{node}/heartbeat")
async def heartbeat(body: HeartbeatIn, wait: float = 0.0,
                    node_id: int = Depends(agent_node_id),
                    ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    """With ``wait``, a long poll: answered at once when there is work the agent does not run
    yet (a launcher to start, a command), else when some arrives or ``wait`` has passed, so
    a gang placed on a machine starts there in milliseconds, not at the next heartbeat."""
    wait = max(0.0, min(wait, 10.0))
    payload = body.model_dump()
    running = {(str(x.get("attempt")), int(x.get("node_rank", -1)))
               for x in payload["launchers"] if x.get("alive")}
    key = f"node:{node_id}"

    def beat() -> dict[str, Any]:
        with ctx.db.session() as s:
            row = s.get(Node, node_id)
            assert row is not None
            try:
                return agents.heartbeat(ctx, s, row, payload)
            finally:
                payload.pop("health", None)  # applied once, not at each look of the poll

    while True:
        seen = notify.version(key)
        reply = await run_in_threadpool(beat)
        wanted = {(w["attempt"], int(w["node_rank"])) for w in reply["run"]}
        # launchers it runs that are no longer wanted are its own to sweep: no reason to answer
        if wait <= 0 or reply["commands"] or wanted - running or reply["state"] == "lost" \
                or reply.get("health_check"):
            return reply
        if not await notify.wait_change(key, seen, wait):
            return reply
        wait = 0.0  # something changed: look once more, and answer


@router.post("/agent/nodes/{node}/commands/{command_id}")
def command_result(body: ResultIn, command_id: int = Path(ge=1, le=INT32_MAX),
                   row: Node = Depends(agent_node),
                   s: Session = Depends(session)) -> dict[str, Any]:
    agents.complete_command(s, row, command_id, body.model_dump())
    return {"ok": True}


@router.post("/workspaces/{ws}/clusters/{name}/join-tokens",
             dependencies=[Depends(InWorkspace(Role.owner, "cluster.join_token.create"))])
def create_join_token(ws: str, name: str, body: JoinTokenIn, s: Session = Depends(session),
                      ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    """The token is shown once, here, to the admin who asked; only its hash is kept."""
    data = agents.create_join_token(s, ws, name, body.ttl)
    data["server"] = ctx.node_url or ctx.api_url
    data["ca_sha256"] = None
    if ctx.tls_ca:
        from batchyard.server.tls import ca_fingerprint

        data["ca_sha256"] = ca_fingerprint(__import__("pathlib").Path(ctx.tls_ca))
    return data


@router.get("/workspaces/{ws}/clusters/{name}/join-tokens",
            dependencies=[Depends(InWorkspace(Role.owner))])
def list_join_tokens(ws: str, name: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return agents.list_join_tokens(s, ws, name)


@router.delete("/workspaces/{ws}/clusters/{name}/join-tokens",
               dependencies=[Depends(InWorkspace(Role.owner, "cluster.join_token.revoke"))])
def revoke_join_tokens(ws: str, name: str, prefix: str | None = None,
                       s: Session = Depends(session)) -> dict[str, Any]:
    return agents.revoke_join_tokens(s, ws, name, prefix)
