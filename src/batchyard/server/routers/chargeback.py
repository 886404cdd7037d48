"""Usage, prices and budgets (issue 35). Reports and changes are a server admin's (they span
every workspace); the price list and budgets are readable by anyone signed in."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from batchyard.server.routers.deps import CommitRoute, session
from batchyard.server.security.permissions import Admin, SignedIn
from batchyard.server.services import chargeback, usage_report

router = APIRouter(route_class=CommitRoute)


class PriceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    per_hour: float = Field(..., ge=0, le=1e9, description="Cost of one node an hour.")
    currency: str = Field("USD", min_length=3, max_length=8, description="As EUR, USD.")


class BudgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu_hours: float = Field(..., ge=0, le=1e12, description="GPU-hours a period.")
    period: Literal["day", "week", "month"] = "month"
    action: Literal["warn", "hold"] = "warn"


@router.get("/usage", dependencies=[Depends(Admin())])
def usage(by: str = Query("team", max_length=16), since: float = Query(..., ge=0),
          until: float | None = Query(None, ge=0),
          s: Session = Depends(session)) -> dict[str, Any]:
    return usage_report.report(s, by, since, until)


@router.get("/prices", dependencies=[Depends(SignedIn())])
def list_prices(s: Session = Depends(session)) -> list[dict[str, Any]]:
    return chargeback.prices(s)


@router.put("/prices/{size}", dependencies=[Depends(Admin("price.set"))])
def set_price(size: str, body: PriceIn, s: Session = Depends(session)) -> dict[str, Any]:
    return chargeback.set_price(s, size, body.per_hour, body.currency)


@router.get("/budgets", dependencies=[Depends(SignedIn())])
def list_budgets(s: Session = Depends(session)) -> list[dict[str, Any]]:
    return chargeback.budgets(s)


@router.put("/budgets/{team}", dependencies=[Depends(Admin("budget.set"))])
def set_budget(team: str, body: BudgetIn, s: Session = Depends(session)) -> dict[str, Any]:
    return chargeback.set_budget(s, team, body.gpu_hours, body.period, body.action)
