"""Node launcher and job credentials (DESIGN §8): a launcher's acts for one (attempt, node
rank) and nothing else; a job's for its job. Both are derived from the server's admin token,
not stored, so a server that died mid-launch hands out the same credentials again. Another
server of the same database (a standby that took over) has another admin token: it takes a
launcher credential it did not make when its hash is the one the launch stored."""

from __future__ import annotations

import hashlib
import hmac
import threading

from sqlalchemy import select

from batchyard.errors import AuthError, Forbidden
from batchyard.server.context import ServerContext
from batchyard.store.models import Attempt, NodeReport


def _mac(ctx: ServerContext, what: str) -> str:
    return hmac.new(ctx.admin_token.encode(), what.encode(), hashlib.sha256).hexdigest()[:40]


def launch_token(ctx: ServerContext, attempt_uuid: str, node_rank: int) -> str:
    """Acts for one (attempt, node rank) only. Derived, not stored: a server that died
    mid-launch hands out the same credential again, so a launcher already running keeps its
    voice."""
    return f"launch.{attempt_uuid}.{node_rank}.{_mac(ctx, f'launch:{attempt_uuid}:{node_rank}')}"


_foreign: dict[str, tuple[str, int]] = {}  # token hash -> (attempt, node rank), checked
_foreign_lock = threading.Lock()


def _issued_elsewhere(ctx: ServerContext, token: str, attempt_uuid: str,
                      node_rank: int) -> bool:
    digest = token_hash(token)
    with _foreign_lock:
        if _foreign.get(digest) == (attempt_uuid, node_rank):
            return True
    with ctx.db.session() as session:
        found = session.scalar(select(NodeReport.id).join(
            Attempt, Attempt.id == NodeReport.attempt_id).where(
            NodeReport.token_hash == digest, NodeReport.node_rank == node_rank,
            Attempt.uuid == attempt_uuid))
    if found is None:
        return False
    with _foreign_lock:
        if len(_foreign) > 100_000:
            _foreign.clear()
        _foreign[digest] = (attempt_uuid, node_rank)
    return True


def job_token(ctx: ServerContext, job_id: int, attempt_uuid: str) -> str:
    return "job." + _mac(ctx, f"job:{job_id}:{attempt_uuid}")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_launcher(ctx: ServerContext, token: str, attempt_uuid: str, node_rank: int) -> None:
    """401 for a token that is not a launcher credential at all, 403 for one that is valid
    but speaks for another attempt or node. A credential made by another server of this
    database (the leader that died, whose launchers now report here) is checked against the
    hash its launch stored."""
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != "launch" or not parts[2].isdigit():
        raise AuthError("not a node launcher credential")
    if not hmac.compare_digest(token, launch_token(ctx, parts[1], int(parts[2]))) \
            and not _issued_elsewhere(ctx, token, parts[1], int(parts[2])):
        raise AuthError("invalid node launcher credential")
    if parts[1] != attempt_uuid or int(parts[2]) != node_rank:
        raise Forbidden("this credential acts only for its own attempt and node")
