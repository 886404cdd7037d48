"""Metric batches a rank left in its spool (the SDK writes one when the server is away: a
restart, a network cut) are sent by the node's launcher after the ranks end, until the
server has them or the time runs out. A rank that exits while the server is down would
otherwise take its last values with it: no later process of the job adopts them.

Safe to resend: every batch carries its id and the server keeps a batch once. Standard
library only (the launcher runs under ``python -S``)."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from batchyard.launchplan import NodePlan

RETRY = 0.5


def spool_dir(plan: NodePlan) -> Path:
    """Where the SDK's ranks spool (sdk.metrics: beside the job's attempts)."""
    return Path(plan.attempt_dir).parent / ".metrics-spool"


def _files(plan: NodePlan) -> list[Path]:
    folder = spool_dir(plan)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(f"*-a{plan.attempt}-r*.jsonl") if p.is_file()
                  and not p.is_symlink())


def _post(plan: NodePlan, body: bytes, context: ssl.SSLContext | None) -> str:
    path = (f"/api/v1/workspaces/{urllib.parse.quote(plan.workspace)}/experiments/"
            f"{urllib.parse.quote(plan.experiment)}/jobs/{urllib.parse.quote(plan.job_name)}"
            "/metrics")
    request = urllib.request.Request(str(plan.api_url).rstrip("/") + path, data=body,
                                     method="POST")
    request.add_header("Authorization", f"Bearer {plan.api_token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context):
            return "ok"
    except urllib.error.HTTPError as exc:
        return "retry" if exc.code in (408, 429) or exc.code >= 500 else "rejected"
    except OSError:
        return "retry"


def replay(plan: NodePlan, deadline: float,
           context: ssl.SSLContext | None = None) -> tuple[int, int]:
    """(values sent, values left): each file's batches in order; a file is removed once every
    batch in it is taken (or refused for good, which resending cannot change)."""
    if not plan.api_url or not plan.api_token:
        return 0, 0
    sent = left = 0
    for path in _files(plan):
        try:
            lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line]
        except OSError:
            continue
        pending = list(lines)
        while pending:
            line = pending[0]
            try:
                count = len(json.loads(line).get("metrics") or [])
            except ValueError:
                pending.pop(0)
                continue
            answer = _post(plan, line.encode(), context)
            if answer == "retry":
                if time.time() + RETRY > deadline:
                    break
                time.sleep(RETRY)
                continue
            pending.pop(0)
            if answer == "ok":
                sent += count
        left += sum(len(json.loads(x).get("metrics") or []) for x in pending
                    if x.startswith("{"))
        try:
            if pending:
                path.write_text("\n".join(pending) + "\n", encoding="utf-8")
            else:
                path.unlink()
        except OSError:
            pass
    return sent, left


def replay_for(launcher: Any, budget: float = 60.0) -> None:
    """The launcher's hook: replay, and say in its log what was sent or is left. To the
    server the node channel reaches now (it may have moved since the ranks started), and
    briefly once the launcher was told to stop."""
    plan = launcher.plan
    if not _files(plan):
        return
    channel = getattr(launcher, "channel", None)
    if channel is not None:
        plan.api_url = channel.server
        if channel.abandon.is_set():
            budget = min(budget, 5.0)
    from batchyard.node.channel import _context

    try:
        sent, left = replay(plan, time.time() + budget, _context(str(plan.api_url),
                                                                   plan.ca_file))
    except Exception as exc:  # never let metrics keep the launcher from ending
        launcher.say(f"replaying spooled metrics failed: {exc}")
        return
    if sent or left:
        launcher.say(f"spooled metrics: {sent} value(s) sent"
                     + (f", {left} left in {spool_dir(plan)}" if left else ""))
