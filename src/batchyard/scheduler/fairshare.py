"""The fair-share tree of one pass: Slurm's classic algorithm over teams and the people in them.

Normalised shares multiply down the tree (a team's shares over every team's, a person's over
the team's members'); effective usage is the account's own plus its part of what its team
used (``U_E = U_A + (U_E,team - U_A) * S_user / S_siblings``); the factor is
``F = 2^(-U_E / S)``. Only the order matters to the queue, and F falls as ``U_E / S`` grows,
so the key is the raw ``U_E / S`` (lower goes first).

Usage comes decayed from the store (the half-life is the server's); this pass adds a charge
for each running job (its nodes for ``charge`` seconds, less what it already ran) and for
each job it places, so a pass with many free nodes shares them out instead of handing them
all to whoever had the best factor when it began (Kueue's admission penalty does the same).
A placement changes the keys of its team's people only, so the walk re-keys them lazily
(``version``)."""

from __future__ import annotations

import math

from batchyard.scheduler.model import AccountView, ClusterView, FairShareView, RunningJobView

NO_TEAM = ""
_EMPTY = AccountView(0, NO_TEAM, "")


def per_node(cluster: ClusterView) -> int:
    """What a node of the cluster counts for: its GPUs, else its vCPUs."""
    return cluster.gpus_per_node or cluster.vcpus_per_node or 1


def team_label(team: str) -> str:
    return f"team {team}" if team else "people in no team"


def hours(gpu: float, cpu: float) -> str:
    """'41 GPU-h', '3.2 CPU-h', '41 GPU-h and 3.2 CPU-h' (seconds in)."""
    parts = [f"{_round(v / 3600)} {unit}-h" for v, unit in ((gpu, "GPU"), (cpu, "CPU"))
             if v > 0]
    return " and ".join(parts) or "0 GPU-h"


def _round(value: float) -> str:
    if value >= 10:
        return f"{value:.0f}"
    return f"{value:.1f}".removesuffix(".0") if value >= 0.1 else f"{value:.2g}"


def percent(fraction: float) -> str:
    value = fraction * 100
    if value >= 10 or value == 0:
        return f"{value:.0f}"
    return f"{value:.1f}".removesuffix(".0")


class FairShare:
    """Keys, charges and the words for one pass."""

    __slots__ = ("_parts", "_texts", "_total_shares", "accounts", "charge_seconds", "cpu", "gpu",
                 "members", "team_cpu", "team_gpu", "team_shares", "team_usage", "total",
                 "usage", "version")

    def __init__(self, view: FairShareView, clusters: dict[int, ClusterView],
                 running: list[RunningJobView], now: float) -> None:
        self.accounts = view.accounts
        self.charge_seconds = view.charge
        self.usage: dict[int, float] = {}
        self.gpu: dict[int, float] = {}  # decayed GPU- and CPU-seconds, for the words
        self.cpu: dict[int, float] = {}
        self.team_usage: dict[str, float] = {}
        self.team_gpu: dict[str, float] = {}
        self.team_cpu: dict[str, float] = {}
        self.members: dict[str, float] = {}  # the sum of the shares of a team's people
        self.team_shares = dict(view.teams)
        self.version: dict[str, int] = {}
        for aid, account in view.accounts.items():
            team = account.team
            self.usage[aid] = account.usage
            self.gpu[aid] = account.gpu_hours * 3600
            self.cpu[aid] = account.cpu_hours * 3600
            self.team_usage[team] = self.team_usage.get(team, 0.0) + account.usage
            self.team_gpu[team] = self.team_gpu.get(team, 0.0) + account.gpu_hours * 3600
            self.team_cpu[team] = self.team_cpu.get(team, 0.0) + account.cpu_hours * 3600
            self.members[team] = self.members.get(team, 0.0) + max(0.0, account.shares)
            self.team_shares.setdefault(team, 1.0)
            self.version[team] = 0
        self._total_shares = sum(max(0.0, s) for s in self.team_shares.values())
        self.total = sum(self.usage.values())
        self._texts: dict[str, str] = {}
        self._parts: dict[int, tuple[str, float, float]] = {}
        charges: dict[tuple[int, bool], float] = {}
        for run in running:
            cluster = clusters.get(run.cluster_id)
            left = self.charge_seconds - (now - run.started_at)
            if cluster is None or left <= 0 or run.account not in self.accounts:
                continue
            key = (run.account, bool(cluster.gpus_per_node))
            charges[key] = charges.get(key, 0.0) + len(run.node_ids) * left * per_node(cluster)
        for (aid, gpus), amount in charges.items():
            self._charge(aid, gpus, amount)

    def team_of(self, account: int) -> str:
        return self.accounts.get(account, _EMPTY).team

    def add(self, account: int, cluster: ClusterView, seconds: float) -> None:
        """Charge ``seconds`` of the cluster's nodes (node-seconds) to the account."""
        if account in self.accounts:
            self._charge(account, bool(cluster.gpus_per_node), seconds * per_node(cluster))

    def _charge(self, account: int, gpus: bool, amount: float) -> None:
        team = self.accounts[account].team
        self.usage[account] += amount
        self.team_usage[team] += amount
        self.total += amount
        kind, team_kind = (self.gpu, self.team_gpu) if gpus else (self.cpu, self.team_cpu)
        kind[account] += amount
        team_kind[team] += amount
        self.version[team] += 1
        self._texts.pop(team, None)

    def placed(self, account: int, cluster: ClusterView, nodes: int) -> None:
        """A job of the account started in this pass: its admission charge."""
        self.add(account, cluster, nodes * self.charge_seconds)

    def _split(self, account: int) -> tuple[float, float]:
        """(the account's part of its team, its normalised shares)."""
        view = self.accounts.get(account)
        if view is None:
            return 1.0, 0.0
        siblings = self.members.get(view.team, 0.0)
        part = max(0.0, view.shares) / siblings if siblings > 0 else 0.0
        if self._total_shares <= 0:
            return part, 0.0
        return part, max(0.0, self.team_shares[view.team]) / self._total_shares * part

    def key(self, account: int) -> float:
        """The effective usage over the normalised shares: lower goes first. Accounts with
        no share at all go last; unknown ones (a snapshot without them) are all equal.
        The walk asks again after every placement of the team: the static parts are kept."""
        found = self._parts.get(account)
        if found is None:
            view = self.accounts.get(account)
            if view is None:
                return 0.0
            part, share = self._split(account)
            found = self._parts[account] = (view.team, part, share)
        team, part, share = found
        if share <= 0:
            return math.inf
        own = self.usage[account]
        return (own + (self.team_usage[team] - own) * part) / share

    def team_share(self, team: str) -> float:
        if self._total_shares <= 0:
            return 0.0
        return max(0.0, self.team_shares.get(team, 1.0)) / self._total_shares

    def describe(self, team: str) -> str:
        """'team vision is over its fair share (used 41 GPU-h, share 25 %)', or the words
        for a team below its share that still comes after another."""
        text = self._texts.get(team)
        if text is None:
            share = self.team_share(team)
            used = self.team_usage.get(team, 0.0)
            said = (f"(used {hours(self.team_gpu.get(team, 0.0), self.team_cpu.get(team, 0.0))}"
                    f", share {percent(share)} %)")
            over = self.total > 0 and used / self.total > share
            label = team_label(team)
            verb = "are" if not team else "is"
            whose = "their" if not team else "its"
            if over:
                text = f"{label} {verb} over {whose} fair share {said}"
            else:
                text = (f"{label} {verb} within {whose} fair share, others further below "
                        f"theirs {said}")
            self._texts[team] = text
        return text


class Tally:
    """Waiting jobs walked so far on one cluster in one priority class, by team, with the
    two largest kept as counts grow, so that a reason can name who goes first in O(1)."""

    __slots__ = ("counts", "top", "total")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        # at most two (-count, team), largest count first (then by name): tuples in order
        self.top: list[tuple[int, str]] = []
        self.total = 0

    def add(self, team: str, count: int) -> None:
        if count <= 0:
            return
        now = self.counts.get(team, 0) + count
        self.counts[team] = now
        self.total += count
        entry = (-now, team)
        top = self.top
        # counts only grow: a team's entry can only move up
        if top and top[0][1] == team:
            top[0] = entry
        elif len(top) > 1 and top[1][1] == team:
            top[1] = entry
            if entry < top[0]:
                top[0], top[1] = entry, top[0]
        elif not top:
            top.append(entry)
        elif entry < top[0]:
            self.top = [entry, top[0]]
        elif len(top) < 2:
            top.append(entry)
        elif entry < top[1]:
            top[1] = entry

    def ahead(self, team: str) -> str:
        """'3 jobs of team nlp go first' (and how many of other teams), '' for none."""
        others = self.total - self.counts.get(team, 0)
        if others <= 0:
            return ""
        first = self.top[0]
        negative, best_team = first if first[1] != team else self.top[1]
        best = -negative
        jobs = "1 job" if best == 1 else f"{best} jobs"
        of = f"of team {best_team}" if best_team else "of people in no team"
        rest = others - best
        if rest:
            return f"{jobs} {of} and {rest} of other teams go first"
        return f"{jobs} {of} {'goes' if best == 1 else 'go'} first"
