"""Prices per node size and budgets per team (issue 35): what the usage report costs with,
and what warns on submit or holds a team's queued jobs once its GPU-hours for the period
are spent."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from batchyard.errors import SpecError
from batchyard.server.fairshare_book import units_of
from batchyard.store.identity import Budget, Price, Team, TeamMember, User
from batchyard.store.models import Attempt, Cluster, Job, now

PERIODS = ("day", "week", "month")
ACTIONS = ("warn", "hold")


def team_of(session: Session, user: str | None) -> str | None:
    """The submitter's team (the oldest of theirs), recorded on the job."""
    if not user:
        return None
    return session.scalar(select(Team.name).join(TeamMember, TeamMember.team_id == Team.id)
                          .join(User, User.id == TeamMember.user_id)
                          .where(User.name == user).order_by(Team.id).limit(1))


def known_sizes(session: Session) -> set[str]:
    from batchyard.spec.sizes import CATALOG

    return set(CATALOG) | {str((c.size or {}).get("name")) for c in session.scalars(
        select(Cluster)) if (c.size or {}).get("name")}


def set_price(session: Session, size: str, per_hour: float, currency: str) -> dict[str, Any]:
    if not math.isfinite(per_hour) or per_hour < 0:
        raise SpecError("per_hour: must be 0 or more")
    currency = currency.strip().upper()
    if not (currency.isalpha() and 3 <= len(currency) <= 8):
        raise SpecError(f"currency: {currency!r} is not a currency code (as EUR, USD)")
    if size not in known_sizes(session):
        raise SpecError(f"size: no node size {size!r} (`batchyard cluster create -s` "
                        "takes the known ones)")
    price = session.get(Price, size)
    if price is None:
        price = Price(size=size)
        session.add(price)
    price.per_hour, price.currency, price.updated_at = per_hour, currency, now()
    session.flush()
    return price_dict(price)


def price_dict(price: Price) -> dict[str, Any]:
    return {"size": price.size, "per_hour": price.per_hour, "currency": price.currency}


def prices(session: Session) -> list[dict[str, Any]]:
    return [price_dict(p) for p in session.scalars(select(Price).order_by(Price.size))]


def set_budget(session: Session, team: str, gpu_hours: float, period: str,
               action: str) -> dict[str, Any]:
    if not math.isfinite(gpu_hours) or gpu_hours < 0:
        raise SpecError("gpu_hours: must be 0 or more")
    if period not in PERIODS:
        raise SpecError(f"period: one of {', '.join(PERIODS)}, not {period!r}")
    if action not in ACTIONS:
        raise SpecError(f"action: one of {', '.join(ACTIONS)}, not {action!r}")
    found = session.scalar(select(Team).where(Team.name == team))
    if found is None:
        raise SpecError(f"team: no team {team!r} (`batchyard team list` shows them)")
    budget = session.get(Budget, found.id)
    if budget is None:
        budget = Budget(team_id=found.id)
        session.add(budget)
    budget.gpu_hours, budget.period, budget.action = gpu_hours, period, action
    budget.updated_at = now()
    session.flush()
    return budget_dict(session, found.name, budget)


def budget_dict(session: Session, team: str, budget: Budget) -> dict[str, Any]:
    return {"team": team, "gpu_hours": budget.gpu_hours, "period": budget.period,
            "action": budget.action, "used_gpu_hours": round(used(session, team,
                                                                  budget.period), 3)}


def budgets(session: Session) -> list[dict[str, Any]]:
    return [budget_dict(session, name, b) for b, name in session.execute(
        select(Budget, Team.name).join(Team, Team.id == Budget.team_id).order_by(Team.name))]


def period_start(period: str, at: float) -> float:
    """The start of the calendar day, ISO week or month (UTC) that holds ``at``."""
    day = dt.datetime.fromtimestamp(at, dt.UTC).replace(hour=0, minute=0, second=0,
                                                        microsecond=0)
    if period == "week":
        day -= dt.timedelta(days=day.weekday())
    elif period == "month":
        day = day.replace(day=1)
    return day.timestamp()


def used(session: Session, team: str, period: str, at: float | None = None) -> float:
    """GPU-hours the team's jobs held in the current period (running ones up to now)."""
    at = now() if at is None else at
    since = period_start(period, at)
    total = 0.0
    for started, ended, node_ids, size in session.execute(
            select(Attempt.started_at, Attempt.ended_at, Attempt.node_ids, Cluster.size)
            .join(Job, Job.id == Attempt.job_id)
            .outerjoin(Cluster, Cluster.id == Job.cluster_id)
            .where(Job.team == team, Attempt.started_at.is_not(None),
                   (Attempt.ended_at.is_(None)) | (Attempt.ended_at > since))):
        units, gpu = units_of(size)
        if not gpu:
            continue
        span = min(at, ended if ended is not None else at) - max(since, started)
        total += max(0.0, span) * units * len(node_ids or ()) / 3600
    return total


def _spent(session: Session, team: str | None) -> tuple[Budget, float] | None:
    if not team:
        return None
    budget = session.scalar(select(Budget).join(Team, Team.id == Budget.team_id)
                            .where(Team.name == team))
    if budget is None:
        return None
    spent = used(session, team, budget.period)
    return (budget, spent) if spent >= budget.gpu_hours else None


def reason(team: str, budget: Budget, spent: float) -> str:
    """The words of a held job and of the submit warning."""
    return (f"budget of team {team} is spent: {spent:.1f} of {budget.gpu_hours:g} GPU-h "
            f"this {budget.period} (action {budget.action}; `batchyard budget set --team "
            f"{team}` raises it)")


def budget_warning(session: Session, team: str | None) -> str | None:
    found = _spent(session, team)
    return None if found is None or team is None else reason(team, *found)


def with_warning(session: Session, team: str | None, made: dict[str, Any]) -> dict[str, Any]:
    """A submit's answer, with ``warnings`` when its team's budget is spent."""
    warning = budget_warning(session, team)
    if warning:
        made["warnings"] = [warning]
    return made


def held_teams(session: Session) -> dict[str, str]:
    """Teams whose queued jobs wait: a budget with the action hold, spent."""
    held: dict[str, str] = {}
    for name in session.scalars(select(Team.name).join(Budget, Budget.team_id == Team.id)
                                .where(Budget.action == "hold")):
        found = _spent(session, name)
        if found is not None:
            held[name] = reason(name, *found)
    return held
