"""What the fair-share order needs from the store: each submitter's usage (GPU-seconds of
the nodes their attempts held, CPU-seconds on nodes without GPUs), decayed with the
half-life, and the tree of teams and people with their shares.

Ended attempts are summed once and kept (as at a reference time: decay multiplies every
sum alike), then only attempts that ended since are read; running ones are read every
pass. A submitter is a job's ``created_by`` (a user or service account's name); one in
several teams counts in the oldest of them, one in none under "people in no team"."""

from __future__ import annotations

import math
import os
import threading
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.scheduler import AccountView, FairShareView
from batchyard.spec.durations import parse_duration
from batchyard.store.identity import Team, TeamMember, User
from batchyard.store.models import Attempt, Cluster, Job

HALF_LIFE_ENV = "BATCHYARD_FAIRSHARE_HALF_LIFE"
DEFAULT_HALF_LIFE = 7 * 86400.0
OVERLAP = 300.0  # seconds of ended_at read again (commits land out of order)


def half_life() -> float:
    """The server's --fairshare-half-life (seconds; default 7 days)."""
    value = os.environ.get(HALF_LIFE_ENV)
    if not value:
        return DEFAULT_HALF_LIFE
    try:
        seconds = parse_duration(value)
    except (TypeError, ValueError):
        return DEFAULT_HALF_LIFE
    return seconds if seconds > 0 else DEFAULT_HALF_LIFE


class Accounts:
    """Submitter names as the small integers the scheduler's views carry (stable for the
    process: the queue's views are made once and kept)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._names: list[str] = [""]
        self._lock = threading.Lock()

    def id_of(self, name: str | None) -> int:
        key = name or ""
        found = self._ids.get(key)
        if found is None:
            with self._lock:
                found = self._ids.setdefault(key, len(self._names))
                if found == len(self._names):
                    self._names.append(key)
        return found

    def name_of(self, account: int) -> str:
        return self._names[account]


ACCOUNTS = Accounts()


def decayed(units: float, start: float, end: float, at: float, half: float) -> float:
    """The integral of ``units`` over [start, end], each moment weighted 2^(-(at - t)/half)."""
    if end <= start:
        return 0.0
    k = math.log(2) / half
    return units / k * (math.exp(-k * (at - end)) - math.exp(-k * (at - start)))


def units_of(size: dict[str, Any] | None) -> tuple[float, bool]:
    """What one node of a size counts for, and whether in GPUs."""
    size = size or {}
    gpus = int(size.get("gpus") or 0)
    return (float(gpus), True) if gpus else (float(size.get("vcpus") or 1), False)


_USAGE_COLUMNS = (Attempt.id, Attempt.started_at, Attempt.ended_at, Attempt.node_ids,
                  Job.created_by, Cluster.size)


class UsageBook:
    def __init__(self) -> None:
        self.half = 0.0
        self.ref = 0.0
        self.high = -math.inf  # newest ended_at read
        self.seen: dict[int, float] = {}  # attempt id -> ended_at, within OVERLAP of high
        self.usage: dict[str, list[float]] = {}  # name -> [GPU-s, CPU-s] as at ``ref``

    def _read_ended(self, session: Session, now: float) -> None:
        half = half_life()
        if half != self.half:
            self.half, self.ref, self.high = half, now, now - 20 * half
            self.seen, self.usage = {}, {}
        query = (select(*_USAGE_COLUMNS).join(Job, Job.id == Attempt.job_id)
                 .outerjoin(Cluster, Cluster.id == Job.cluster_id)
                 .where(Attempt.ended_at >= self.high - OVERLAP,
                        Attempt.started_at.is_not(None)))
        for aid, started, ended, node_ids, who, size in session.execute(query):
            if aid in self.seen:
                continue
            self.seen[aid] = ended
            self.high = max(self.high, ended)
            units, gpu = units_of(size)
            amount = decayed(units * len(node_ids or ()), started, ended, self.ref, self.half)
            self.usage.setdefault(who or "", [0.0, 0.0])[0 if gpu else 1] += amount
        self.seen = {a: e for a, e in self.seen.items() if e >= self.high - OVERLAP}

    def view(self, session: Session, now: float, queued_accounts: set[int]) -> FairShareView:
        """The fair-share tree for a pass: everyone with queued jobs or usage."""
        self._read_ended(session, now)
        scale = math.exp(-math.log(2) / self.half * (now - self.ref))
        totals = {name: [gpu * scale, cpu * scale] for name, (gpu, cpu) in self.usage.items()}
        running = (select(Attempt.started_at, Attempt.node_ids, Job.created_by, Cluster.size)
                   .join(Job, Job.id == Attempt.job_id)
                   .outerjoin(Cluster, Cluster.id == Job.cluster_id)
                   .where(Attempt.ended_at.is_(None), Attempt.started_at.is_not(None)))
        for started, node_ids, who, size in session.execute(running):
            units, gpu = units_of(size)
            totals.setdefault(who or "", [0.0, 0.0])[0 if gpu else 1] += decayed(
                units * len(node_ids or ()), started, now, now, self.half)
        teams = {t.name: max(0.0, t.shares) for t in session.scalars(select(Team))}
        member: dict[str, tuple[str, float]] = {}
        for name, team, shares in session.execute(
                select(User.name, Team.name, TeamMember.shares)
                .join(TeamMember, TeamMember.user_id == User.id)
                .join(Team, Team.id == TeamMember.team_id).order_by(Team.id.desc())):
            member[name] = (team, shares)  # the lowest team id wins
        names = set(totals) | {ACCOUNTS.name_of(a) for a in queued_accounts}
        accounts: dict[int, AccountView] = {}
        for name in names:
            team, shares = member.get(name, ("", 1.0))
            gpu_s, cpu_s = totals.get(name, (0.0, 0.0))
            aid = ACCOUNTS.id_of(name)
            accounts[aid] = AccountView(aid, team, name, shares, gpu_s + cpu_s, gpu_s / 3600,
                                        cpu_s / 3600)
        return FairShareView(accounts, teams)
