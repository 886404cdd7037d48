"""The portal's sweep page (trials table, objective over trials, parallel coordinates of
parameters -> objective) and its data endpoint, behind the session cookie like every page."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from batchyard.server.portal.access import Caller, PortalRule
from batchyard.server.routers.deps import session
from batchyard.server.security.principal import Role
from batchyard.server.services import sweeps

router = APIRouter(include_in_schema=False)
SWEEP = "/ws/{ws}/exp/{exp}/sweeps/{name}"


@router.get(SWEEP)
def sweep_page(request: Request, ws: str, exp: str, name: str,
               caller: Caller = Depends(PortalRule(Role.reader, page=True)),
               s: Session = Depends(session)) -> Response:
    from batchyard.server.portal.pages import render, visible_workspaces

    return render("sweep.html", request, caller, ws=ws, exp=exp,
                  sweep=sweeps.show(s, ws, exp, name),
                  workspaces=visible_workspaces(caller, s), page="experiments")


@router.get("/portal/api" + SWEEP, dependencies=[Depends(PortalRule(Role.reader, page=False))])
def sweep_data(ws: str, exp: str, name: str, s: Session = Depends(session)) -> dict[str, Any]:
    data = sweeps.show(s, ws, exp, name)
    data.pop("spec", None)  # the trial's full spec is on each trial's job page
    return data


def experiment_sweeps(s: Session, ws: str, exp: str) -> list[dict[str, Any]]:
    """The sweeps of an experiment, for its page."""
    return sweeps.list_all(s, ws, exp)
