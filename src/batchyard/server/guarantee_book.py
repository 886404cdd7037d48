"""What the scheduling pass reads of teams' guarantees (issue 35 §2), and the reclaim step
after it: borrowed jobs preempted through the existing path (SIGTERM, the cluster's grace
period, the checkpoint dir kept, requeued without using a retry).

Cheap when no guarantee is set: the rows are read again only every ``REFRESH`` seconds (or
at once after a change made by this process), and a pass with none builds no view, runs no
guard and no reclaim."""

from __future__ import annotations

import logging
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.scheduler.guarantees import given_back_text, reclaim, reclaimed_text
from batchyard.scheduler.model import (
    Guarantee,
    GuaranteeView,
    JobView,
    NodeView,
    Plan,
    RunningJobView,
)
from batchyard.server.fairshare_book import ACCOUNTS
from batchyard.server.services import common
from batchyard.server.services.interrupts import interrupt
from batchyard.states import ATTEMPT_ACTIVE
from batchyard.store.identity import Guarantee as GuaranteeRow
from batchyard.store.identity import Team, TeamMember, User
from batchyard.store.models import Attempt, Cluster, Job

log = logging.getLogger("batchyard.reconciler")
REFRESH = 5.0
_generation = 0


def changed() -> None:
    """A guarantee was set or removed here: the next pass reads them again."""
    global _generation
    _generation += 1


class GuaranteeBook:
    def __init__(self) -> None:
        self._read_at = float("-inf")
        self._seen = -1
        self._rows: dict[int, dict[str, Guarantee]] = {}
        self._teams: dict[str, str] = {}  # submitter -> team, read with the rows
        self.version = 0

    def refresh(self, session: Session) -> None:
        """Read the guarantees again when this process changed one, or ``REFRESH`` seconds
        after the last read (another server may have); ``version`` says when they differ."""
        stamp = time.monotonic()
        if self._seen == _generation and stamp - self._read_at < REFRESH:
            return
        self._seen, self._read_at = _generation, stamp
        rows: dict[int, dict[str, Guarantee]] = {}
        for row, team in session.execute(select(GuaranteeRow, Team.name).join(
                Team, Team.id == GuaranteeRow.team_id)):
            rows.setdefault(row.cluster_id, {})[team] = Guarantee(row.nodes, row.borrow_limit)
        teams: dict[str, str] = {}
        if rows:
            for user, team in session.execute(
                    select(User.name, Team.name).join(TeamMember, TeamMember.user_id == User.id)
                    .join(Team, Team.id == TeamMember.team_id).order_by(Team.id.desc())):
                teams[user] = team  # the oldest team wins, as a job's recorded team
        if rows != self._rows or teams != self._teams:
            self.version += 1
        self._rows, self._teams = rows, teams

    def view(self, clusters: set[int], queued: list[JobView],
             running: list[RunningJobView]) -> GuaranteeView | None:
        """The guarantees of the clusters scheduled this pass; None when none has any."""
        if not self._rows:
            return None
        mine = {cid: g for cid, g in self._rows.items() if cid in clusters}
        if not mine:
            return None
        accounts = {j.account for j in queued if j.cluster_id in mine}
        accounts.update(r.account for r in running if r.cluster_id in mine)
        team_of = {a: self._teams.get(ACCOUNTS.name_of(a), "") for a in accounts}
        return GuaranteeView(mine, team_of)


def free_after(nodes: list[NodeView], plan: Plan, clusters: set[int]) -> dict[int, int]:
    taken = {n for p in plan.placements for n in p.node_ids}
    free: dict[int, int] = {}
    for node in nodes:
        if node.cluster_id in clusters and node.free and node.id not in taken:
            free[node.cluster_id] = free.get(node.cluster_id, 0) + 1
    return free


def take_back(session: Session, view: GuaranteeView, plan: Plan, queued: list[JobView],
              running: list[RunningJobView], nodes: list[NodeView], now: float,
              held: dict[str, str] | None = None) -> dict[int, str]:
    """Preempt the borrowed jobs that hold guaranteed teams' capacity. A team held by its
    budget reclaims nothing: its jobs could not start on the nodes. Answers the reasons of
    the guaranteed teams' jobs that wait for borrowed nodes to come back."""
    placed = {p.job_id for p in plan.placements}
    held = held or {}
    waiting = [j for j in queued if j.id not in placed and j.cluster_id in view.clusters
               and (team := view.team_of.get(j.account, "")) in view.clusters[j.cluster_id]
               and team not in held]
    if not waiting:
        return {}
    holding = [r for r in running if r.cluster_id in view.clusters]
    stopping: set[int] = set()
    since: dict[int, float] = {}  # the current attempt's start: a requeued job's work before
    if holding:                   # it is in its checkpoint
        for job_id, state, started, created in session.execute(select(
                Attempt.job_id, Attempt.state, Attempt.started_at, Attempt.created_at).where(
                Attempt.job_id.in_([r.id for r in holding]), Attempt.state.in_(ATTEMPT_ACTIVE))):
            if state == "stopping":
                stopping.add(job_id)
            since[job_id] = max(since.get(job_id, 0.0), started or created or 0.0)
        for job_id, saved in session.execute(select(Job.id, Job.checkpoint).where(
                Job.id.in_(list(since)), Job.checkpoint.is_not(None))):
            since[job_id] = max(since[job_id], float((saved or {}).get("at") or 0.0))
    awaits: dict[int, tuple[int, ...]] = {}
    victims = reclaim(view, holding, waiting, free_after(nodes, plan, set(view.clusters)),
                      stopping, now, since, awaits)
    for victim in victims:
        job = session.get(Job, victim.job_id)
        cluster = session.get(Cluster, victim.cluster_id)
        if job is None or cluster is None:
            continue
        grace = float((cluster.spec or {}).get("preemption_grace", 30.0))
        why = reclaimed_text(victim.owner)
        notice = float((job.spec.get("limits") or {}).get("checkpoint_notice", 60.0))
        first = f"a {notice:g} s checkpoint notice, then " if notice else ""
        if interrupt(session, job.id, "preempted", why, grace):
            common.record(session, "job", job.id, job.state, job.state,
                          f"{why} ({first}SIGTERM, {grace:g} s grace)")
            log.info("job %s %s", job.id, why)
    names = {r.id: r.name or f"job {r.id}" for r in holding}
    teams = {j.id: view.team_of.get(j.account, "") for j in waiting}
    return {jid: given_back_text(teams.get(jid, ""), [names.get(i, f"job {i}") for i in ids])
            for jid, ids in awaits.items() if ids}
