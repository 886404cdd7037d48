"""The reconciler loop: follows running attempts, turns their node statuses into job states,
and asks the pure scheduler where queued jobs go. All state lives in the database, so a
restarted server picks up exactly where a killed one stopped (launchers keep running)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from batchyard.backends import get_backend
from batchyard.backends.base import GangStatus, QueueState, SupportsQueue, has_queue
from batchyard.server import endings, followups, notify, silence, storage_trouble
from batchyard.server.agenda import QUIET_TICK, Agenda, Watched
from batchyard.server.context import ServerContext
from batchyard.server.nodes import NodeManager
from batchyard.server.scheduling import TICK, SchedulingPass, set_state
from batchyard.server.services import channel, checkpoints, hangs, keepalive, preflight, queued
from batchyard.server.services.interrupts import request_stop
from batchyard.server.telemetry import instruments
from batchyard.states import ATTEMPT_ACTIVE
from batchyard.store.models import Attempt, Cluster, Job, now

log = logging.getLogger("batchyard.reconciler")

ACTIVE_ATTEMPT = ATTEMPT_ACTIVE
QUEUE_POLL = 2.0  # a gang in its backend's queue: the queue's reason (its start comes first
# from its launchers' plan requests; this look is the safety net when they cannot call)
QUEUE_SAFETY_POLL = 5.0  # a started gang reports through its launchers: the queue only in case
VERDICT_WAIT = 5.0
VERDICT_POLL = 0.5  # s between looks while a verdict is awaited: the queue forgets an ended
# job soon (Slurm's MinJobAge), and a look after it would find no cause at all
PASS_GAP = 0.015  # at least this long between passes: each submit woke a whole pass (~1 ms)
MAX_PASS_GAP = 0.1  # the gap doubles up to this while kicks keep arriving within it
LEASE_POLL = 2.0  # a standby asks for the lease this often
IDLE_TICK = 1.0  # s between scheduling passes while time alone may change their answer
_WROTE = "reconciler_wrote"  # session.info: the look at an attempt changed something
SIGNAL_EXITS = (128 + 15, 128 + 9, -15, -9)  # SIGTERM, SIGKILL


class Reconciler:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.nodes = NodeManager()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="launch")
        self._launch_lock = threading.Lock()
        self._launching: set[int] = set()
        self._queue_seen: dict[int, tuple[float, QueueState]] = {}
        self._verdict_since: dict[int, float] = {}
        self.scheduling = SchedulingPass()
        self.agenda = Agenda()
        self._freed = False  # an attempt ended since the last scheduling pass
        # when this process began to lead (its start, or taking the lease over): launchers of
        # attempts already running that it never hears from are lost (server/silence.py)
        self.led_since: float | None = None

    def _beat(self, leading: bool) -> None:
        if self.ctx.registry is None:
            return
        try:
            self.ctx.registry.beat(leading)
        except Exception as exc:
            storage_trouble.log_once(log, "refreshing this server's row failed", exc)

    def run(self, stop: threading.Event) -> None:
        """A pass runs when something is due (server/agenda.py): an attempt an event marked
        (server/followups.py), a timer, a kick (a submit, a resize). Under a stream of
        kicks one is always waiting when the gap ends, and a pass per 15 ms took a sixth of
        the server's CPU at 200 submits/s: the gap then doubles, up to MAX_PASS_GAP, and
        falls back to PASS_GAP at the first gap that ends with no kick. With ten jobs running
        and nothing happening, full passes four times a second took 12 % of a core; now
        their attempts are looked at when they change."""
        followups.configure(self.ctx.wake.set, self._leads_here)
        gap = PASS_GAP
        while not stop.is_set():
            leading = self.ctx.leader is None or self.ctx.leader.held()
            self._beat(leading)
            if not leading:
                self.led_since = None
                self.agenda.forget()
                followups.take()  # the leader hears of them (notify.relay) and looks
                stop.wait(LEASE_POLL)  # another server on this database reconciles
                continue
            if self.led_since is None:  # (re)started, or took the lease over just now
                self.led_since = now()
                followups.everything()
            wait = IDLE_TICK
            try:
                wait = self.tick()
                storage_trouble.recovered(log, "reconciler pass failed; retrying")
            except Exception as exc:
                storage_trouble.log_once(log, "reconciler pass failed; retrying", exc)
                followups.everything()  # what this pass took is looked at again
                self.agenda.schedule_at = float("-inf")
                time.sleep(1)
            stop.wait(gap)  # a burst of kicks (a stream of submits) is one pass
            streaming = self.ctx.wake.is_set()
            self.ctx.wake.wait(max(0.0, wait - gap))
            self.ctx.wake.clear()
            gap = min(MAX_PASS_GAP, gap * 2) if streaming else PASS_GAP

    def _leads_here(self) -> bool:
        return self.ctx.leader is None or self.ctx.leader.leads_now()

    def tick(self) -> float:
        """One pass: a look at each attempt that is due, then a scheduling pass if one is
        wanted. Returns the seconds until the next thing due (a kick or a mark comes
        sooner)."""
        clock = time.monotonic()
        marked, jobs, everything = followups.take()
        sweep = everything or self.agenda.sweep_due(clock)
        if sweep or jobs:
            with self.ctx.db.session() as session:
                if sweep:
                    active = list(session.scalars(select(Attempt.id).where(
                        Attempt.state.in_(ACTIVE_ATTEMPT))))
                    self.agenda.listed(clock, active)
                    if everything:
                        marked.update(active)
                if jobs:
                    marked.update(session.scalars(select(Attempt.id).where(
                        Attempt.job_id.in_(sorted(jobs)), Attempt.state.in_(ACTIVE_ATTEMPT))))
        marked |= self.agenda.liveness(clock)
        for attempt_id in self.agenda.pick(clock, marked):
            self._look(attempt_id)
        if self.ctx.kicked.is_set() or self._freed or clock >= self.agenda.schedule_at:
            self._schedule()
        return self.agenda.next_in(time.monotonic())

    def _look(self, attempt_id: int) -> None:
        """One attempt, in a transaction of its own: one's trouble never stops the rest."""
        try:
            self._look_at_queue(attempt_id)  # squeue, before the lock the launchers wait on
            with channel.control_session(self.ctx.db) as session:
                session.info[_WROTE] = False
                self._fence(session)
                attempt = session.get(Attempt, attempt_id)
                if attempt is None or attempt.state not in ACTIVE_ATTEMPT:
                    self.agenda.end(attempt_id)
                    return
                every, watched = self._follow(session, attempt)
                ended = attempt.state not in ACTIVE_ATTEMPT
                wrote = bool(session.info[_WROTE] or session.new or session.deleted
                             or any(session.is_modified(o) for o in session.dirty))
            if ended:
                self.agenda.end(attempt_id)
                self._freed = True  # its nodes may take a queued job
            else:  # what a change set in motion may be done already: look again at once
                self.agenda.looked(attempt_id, time.monotonic(), 0.0 if wrote else every,
                                   watched)
        except Exception as exc:
            storage_trouble.log_once(log, f"following attempt {attempt_id} failed", exc)
            self.agenda.looked(attempt_id, time.monotonic(), IDLE_TICK, None)

    def _schedule(self) -> None:
        """The queue onto the nodes, and the nodes' own lifecycle; the next pass without a
        kick comes as soon as time alone may change something."""
        self.ctx.kicked.clear()
        self._freed = False
        with channel.control_session(self.ctx.db) as session:
            self._fence(session)
            held = keepalive.expire(session)  # failed gangs' nodes held for job exec
            began = time.perf_counter()
            plan, launched = self.scheduling.run(session)
            instruments.observe_pass(time.perf_counter() - began)
            steady = self.nodes.tick(session, plan, horizon=IDLE_TICK)
        timed = held or self.nodes.timed or bool(self.scheduling.mirror.entries)
        self.agenda.schedule_at = time.monotonic() + (
            IDLE_TICK if steady and timed else QUIET_TICK if steady else TICK)
        for attempt_id in launched:
            self._start_launch(attempt_id)

    def _fence(self, session: Session) -> None:
        if self.ctx.leader is not None:
            self.ctx.leader.fence(session)

    # --- launching, off the loop ------------------------------------------------------------

    def _start_launch(self, attempt_id: int) -> None:
        """A backend's launch may be slow (a Ray placement group is waited for seconds): it
        runs on a worker, so one gang's launch never stalls the loop for every other job."""
        with self._launch_lock:
            if attempt_id in self._launching:
                return
            self._launching.add(attempt_id)
        self._pool.submit(self._launch_worker, attempt_id)

    def _launch_worker(self, attempt_id: int) -> None:
        node_ids: list[int] = []
        ended = False
        try:
            with self.ctx.db.session() as session:
                attempt = session.get(Attempt, attempt_id)
                if attempt is not None and attempt.handle is None \
                        and attempt.state in ACTIVE_ATTEMPT:
                    self._launch(session, attempt)
                    node_ids = list(attempt.node_ids)
                    ended = attempt.state not in ACTIVE_ATTEMPT
        except Exception:
            log.exception("launching attempt %s failed", attempt_id)
        finally:
            with self._launch_lock:
                self._launching.discard(attempt_id)
            for node_id in node_ids:  # committed: agents waiting in a heartbeat look now
                notify.bump(f"node:{node_id}")
            followups.attempt(None, attempt_id)  # the loop follows it from now
            if ended:  # its launch failed: its nodes are free again
                self.ctx.kick()

    def _launch(self, session: Session, attempt: Attempt) -> None:
        job = session.get(Job, attempt.job_id)
        assert job is not None
        cluster = session.get(Cluster, job.cluster_id)
        assert cluster is not None
        try:
            gang = channel.prepare_launch(self.ctx, session, attempt)
            # committed before any launcher starts: its first report, and its ranks' first
            # call with the job token, must find the rows they need (not a 404 to give up on)
            session.commit()
            gang.ca_file = self.ctx.tls_ca
            backend = get_backend(cluster.backend)
            handle = backend.launch(gang)
            attempt.handle = {**handle, "node_names": [n.name for n in gang.nodes]}
            if not has_queue(backend):
                attempt.state = "preparing"
            else:  # its launchers say when it starts: the first look at the queue can wait
                self._queue_seen[attempt.id] = (time.monotonic(), QueueState(
                    "pending", job.pending_reason or ""))
        except Exception as exc:
            log.exception("launch failed")
            self._end_attempt(session, job, attempt, "failed", f"launch failed: {exc}", None)

    # --- following attempts -----------------------------------------------------------------

    def _follow(self, session: Session, attempt: Attempt) -> tuple[float | None,
                                                                   Watched | None]:
        """One look at an active attempt. Returns when it is next due by time alone (None:
        only when something changes it) and what the liveness check watches of it."""
        job = session.get(Job, attempt.job_id)
        assert job is not None
        if attempt.handle is None:  # being launched, or the server died before it was
            self._start_launch(attempt.id)  # the launch marks it when it is done
            return None, None
        cluster = session.get(Cluster, job.cluster_id)
        assert cluster is not None
        backend = get_backend(cluster.backend)
        watched: Watched | None = None
        if has_queue(backend):
            every: float | None = QUEUE_SAFETY_POLL if attempt.node_ids else QUEUE_POLL
            followed = self._follow_queue(session, job, attempt, backend)
            if followed is None:
                return (VERDICT_POLL if attempt.id in self._verdict_since else every), None
            status = followed
        else:
            stamp = now()
            silent = silence.silent_nodes(session, attempt, cluster.spec, self.led_since,
                                          stamp, endings.node_names(attempt))
            every = silence.wait_left(attempt, cluster.spec, self.led_since, stamp)
            alive = backend.alive(attempt.handle)
            watched = Watched(backend, attempt.handle, alive)
            status = channel.gang_status(session, attempt, alive, silent)
        if job.cancel_requested and attempt.cancel_reason is None:
            grace = float((job.spec.get("limits") or {}).get("grace_period", 30.0))
            request_stop(attempt, "canceled", job.stop_reason or "terminated by user",
                         grace)
            attempt.cancel_reason = "user"
            attempt.state = "stopping"
            return every, watched
        lost = [n for n in status.nodes if n.state == "lost"]
        names = endings.node_names(attempt)
        if attempt.state in ("launching", "preparing") and not lost:
            preflight.judge(session, job, attempt, status, names)  # once all nodes reported
        if lost and not status.done:
            message = lost[0].message or "node launcher died"
            if names[lost[0].node_rank] not in message:
                message = f"node launcher on {names[lost[0].node_rank]} died"
            request_stop(attempt, "aborted", message, 3.0)
            attempt.cancel_reason = attempt.cancel_reason or "lost"
            attempt.message = attempt.message or message
        swept = set((attempt.handle or {}).get("swept") or [])
        for node in lost:
            if node.node_rank not in swept:
                backend.stop(attempt.handle, node.node_rank)
                swept.add(node.node_rank)
        if swept != set(attempt.handle.get("swept") or []):
            attempt.handle = {**attempt.handle, "swept": sorted(swept)}
        checkpoints.note(job, status)  # batchyard.checkpoint_saved, via the launchers
        checkpoints.tell_gang(job, attempt)
        if status.done:
            ran = [n.raw["running_at"] for n in status.nodes if n.raw.get("running_at")]
            if ran and attempt.started_at is None:  # it ran and ended between two polls
                attempt.started_at = min(ran)
                job.started_at = job.started_at or attempt.started_at
            self._finish(session, job, attempt, status)
            return None, None
        states = {n.state for n in status.nodes}
        if "succeeded" in states and all(
            n.state == "succeeded" or (n.state == "running" and not n.raw.get("ranks"))
            for n in status.nodes
        ):
            channel.update_control(attempt, finish=True)  # standby nodes of mpi/custom jobs
        if attempt.state in ("launching", "preparing") and status.running:
            attempt.state = "running"
            attempt.started_at = attempt.started_at or now()
            if job.state == "preparing":
                job.started_at = job.started_at or now()
                set_state(session, job, "running", None)
        hangs.watch(session, job, attempt, status)  # limits.hang_timeout, on_hang
        if watched is not None:  # the handle as this look leaves it (a lost node swept)
            watched.handle = dict(attempt.handle or {})
        return _sooner(every, hangs.wait_left(attempt)), watched

    def _follow_queue(self, session: Session, job: Job, attempt: Attempt,
                      backend: SupportsQueue) -> GangStatus | None:
        """A gang on a backend with its own queue: liveness comes from the queue, and a queue
        that ended the gang (a failed node, preemption) names the cause. None: nothing more
        to do this pass (still queued there, or waiting for the queue's verdict)."""
        queue = self._queue_state(backend, attempt)
        if queue is None:
            return None
        if not attempt.node_ids:
            self._follow_queued(session, job, attempt, backend, queue)
            return None
        alive: list[bool | None] = [None] * len(attempt.node_ids)
        reported = channel.gang_status(session, attempt, alive)
        if queue.state != "ended" and attempt.cancel_reason is None and any(
                n.state in ("failed", "aborted", "canceled", "timeout") for n in reported.nodes):
            # a rank died: was it Slurm killing the job (a node failed, preemption)?
            queue = self._queue_state(backend, attempt, fresh=True) or queue
            if queue.lost_nodes:
                self._queue_ended(attempt, queue)
            elif queue.state == "running" and _signalled(reported) \
                    and self._await_verdict(attempt):
                return None  # Slurm SIGTERMs the ranks a moment before it says why
        if queue.state != "ended":
            return reported
        # launchers that had not all reported, or ranks Slurm killed (preemption, a failed
        # node: their last reports are collateral) end with the queue's cause
        succeeded = all(n.state == "succeeded" for n in reported.nodes)
        if not succeeded and (not reported.done or queue.preempted or queue.lost_nodes):
            self._queue_ended(attempt, queue)
        return channel.gang_status(session, attempt, [False] * len(alive))

    def _look_at_queue(self, attempt_id: int) -> None:
        """A look at a queueing backend that is due (a command: squeue), taken before the
        attempt's control lock, on which the launchers' calls (a plan, a report) wait. Only
        for attempts known to be in a queue (the others, and the first look after a restart,
        are looked at under the lock)."""
        seen = self._queue_seen.get(attempt_id)
        if seen is None or time.monotonic() - seen[0] < QUEUE_POLL:
            return
        with self.ctx.db.session() as session:
            attempt = session.get(Attempt, attempt_id)
            job = session.get(Job, attempt.job_id) if attempt is not None else None
            cluster = session.get(Cluster, job.cluster_id) if job is not None else None
            if attempt is None or cluster is None or attempt.handle is None:
                return
            backend = get_backend(cluster.backend)
            if not has_queue(backend):
                return
        self._queue_state(backend, attempt)

    def _queue_state(self, backend: SupportsQueue, attempt: Attempt,
                     fresh: bool = False) -> QueueState | None:
        """At most one look per attempt every QUEUE_POLL seconds while it waits in the
        queue, QUEUE_SAFETY_POLL once its launchers have called back: the queue is a shared
        controller (slurmctld), not ours to poll four times a second per job."""
        seen = self._queue_seen.get(attempt.id)
        every = QUEUE_SAFETY_POLL if attempt.node_ids else QUEUE_POLL
        if not fresh and seen is not None and time.monotonic() - seen[0] < every:
            return seen[1]
        try:
            state = backend.queue_state(attempt.handle or {}, fresh=fresh)
        except Exception as exc:  # slurmctld down: keep what we know, look again next pass
            log.warning("attempt %s: queue state unknown: %s", attempt.id, exc)
            return None
        self._queue_seen[attempt.id] = (time.monotonic(), state)
        return state

    def _follow_queued(self, session: Session, job: Job, attempt: Attempt,
                       backend: SupportsQueue, queue: QueueState) -> None:
        if job.cancel_requested:
            backend.cancel(attempt.handle or {})
            attempt.cancel_reason = "user"
            self._end_attempt(session, job, attempt, "canceled",
                              "terminated by user before it started", None)
            return
        if queue.state == "pending":
            if job.pending_reason != queue.reason:
                job.pending_reason = queue.reason
        elif queue.state == "running":
            queued.bind(self.ctx, session, attempt, job, queue)
        else:
            outcome = "requeue" if queue.preempted else "failed"
            attempt.cancel_reason = "preempted" if queue.preempted else None
            self._end_attempt(session, job, attempt, outcome,
                              f"{queue.reason} before it started", None)

    def _await_verdict(self, attempt: Attempt) -> bool:
        """True while a gang whose ranks were killed by a signal batchyard did not send waits
        (up to VERDICT_WAIT s) for its queue to name the cause (PREEMPTED, NODE_FAIL)."""
        first = self._verdict_since.setdefault(attempt.id, time.monotonic())
        return time.monotonic() - first < VERDICT_WAIT

    @staticmethod
    def _queue_ended(attempt: Attempt, queue: QueueState) -> None:
        """The backend's job ended under launchers that had not all reported (a node failed,
        Slurm preempted it, its time limit, an scancel from outside): the launchers still
        alive (a node whose slurmd died) are told to stop, and the cause is recorded first."""
        if attempt.cancel_reason is not None:
            return
        if queue.preempted:
            attempt.cancel_reason, state = "preempted", "preempted"
        else:
            attempt.cancel_reason, state = "lost", "aborted"
        attempt.message = queue.reason
        # the root cause: Slurm also SIGTERMs the ranks of the other nodes, whose failures
        # (exit 143) would otherwise be taken for the reason
        attempt.handle = {**(attempt.handle or {}), "queue_ended": queue.reason}
        request_stop(attempt, state, queue.reason, 3.0)
        attempt.state = "stopping"

    def _finish(self, session: Session, job: Job, attempt: Attempt, status: GangStatus) -> None:
        self._end_attempt(session, job, attempt, *endings.outcome_of(job, attempt, status))

    def _end_attempt(self, session: Session, job: Job, attempt: Attempt, outcome: str,
                     message: str | None, exit_code: int | None,
                     error: dict[str, Any] | None = None) -> None:
        self._queue_seen.pop(attempt.id, None)
        self._verdict_since.pop(attempt.id, None)
        endings.end_attempt(session, job, attempt, outcome, message, exit_code, error)


def _sooner(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


@event.listens_for(Session, "after_flush")
def _flushed(session: Session, _context: Any) -> None:
    if _WROTE in session.info:
        session.info[_WROTE] = True


def _signalled(status: GangStatus) -> bool:
    """A node failed because a rank was killed by SIGTERM/SIGKILL (from outside: batchyard's
    own stops come with a cancel reason)."""
    return any(n.state == "failed" and n.exit_code in SIGNAL_EXITS for n in status.nodes)
