"""Stack dumps (`job stacks`, the hang watchdog): the user's routes under the job, and the
node channel's route a launcher sends its node's dump to (its own credential, as every
node route). Waiting for the answers is a long poll that holds no worker thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from batchyard.server import notify
from batchyard.server.auth import context
from batchyard.server.context import ServerContext
from batchyard.server.routers.node import launcher
from batchyard.server.security.permissions import InWorkspace
from batchyard.server.security.principal import Role
from batchyard.server.services import channel, jobs, stacks

router = APIRouter(tags=["stacks"])
JOB = "/workspaces/{ws}/experiments/{exp}/jobs/{name}/stacks"
NODE = "/node/attempts/{attempt}/nodes/{node_rank}/stacks"
MAX_WAIT = 60.0
T = TypeVar("T")


class Dump(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=48, pattern=stacks.ID_RE.pattern)
    dump: dict[str, Any]


def _locked(ctx: ServerContext, fn: Callable[[Session], T]) -> T:
    with channel.control_session(ctx.db) as session:
        return fn(session)


def _plain(ctx: ServerContext, fn: Callable[[Session], T]) -> T:
    with ctx.db.session() as session:
        return fn(session)


@router.post(JOB, status_code=201,
             dependencies=[Depends(InWorkspace(Role.contributor, "job.stacks", own=True))])
def request_dump(ws: str, exp: str, name: str,
                 ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    """Ask every node of the job's running attempt for a dump of all its ranks; the
    answers come in at ``GET .../stacks/{id}``."""
    def ask(s: Session) -> dict[str, Any]:
        attempt = stacks.running_attempt(s, jobs.find(s, ws, exp, name))
        return stacks.request(s, attempt, "request")

    return _locked(ctx, ask)


@router.get(JOB, dependencies=[Depends(InWorkspace(Role.reader))])
def list_dumps(ws: str, exp: str, name: str,
               ctx: ServerContext = Depends(context)) -> list[dict[str, Any]]:
    """Every dump kept with the job's attempts, oldest first (hangs and requests)."""
    return _plain(ctx, lambda s: stacks.listing(s, jobs.find(s, ws, exp, name)))


@router.get(JOB + "/{ident}", dependencies=[Depends(InWorkspace(Role.reader))])
async def get_dump(ws: str, exp: str, name: str, ident: str,
                   wait: float = Query(0.0, ge=0, le=MAX_WAIT,
                                       description="Seconds to wait for every node's answer."),
                   ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    """The request and every node's answer so far; ``missing`` names the nodes that have
    not answered (yet, or at all: their launcher ended)."""
    def read(s: Session) -> dict[str, Any]:
        job = jobs.find(s, ws, exp, name)
        attempt = stacks.find_dump(s, job, ident)
        found = stacks.collect(attempt, ident)
        found["attempt_state"] = attempt.state
        return found

    deadline = time.monotonic() + wait
    found = await run_in_threadpool(_plain, ctx, read)
    key = stacks.key(found["attempt_uuid"], ident)
    while True:
        left = deadline - time.monotonic()
        if found["complete"] or left <= 0 or found["attempt_state"] not in (
                "running", "stopping"):
            return found
        await notify.wait_change(key, notify.version(key), min(left, 1.0))
        found = await run_in_threadpool(_plain, ctx, read)


@router.post(NODE)
def node_dump(attempt: str, node_rank: int, body: Dump,
              ctx: ServerContext = Depends(launcher)) -> dict[str, Any]:
    return _plain(ctx, lambda s: stacks.store(s, attempt, node_rank, body.id, body.dump))
