"""The portal's sweep page (trials table, objective over trials, parallel coordinates of
parameters -> objective) and its data endpoint, behind the session cookie like every page."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from batchyard.server.portal.session import PortalSession, data_session, page_session
from batchyard.server.routers.deps import session
from batchyard.server.services import sweeps

router = APIRouter(include_in_schema=False)
SWEEP = "/ws/{ws}/exp/{exp}/sweeps/{name}"


@router.get(SWEEP)
def sweep_page(request: Request, ws: str, exp: str, name: str,
               sess: PortalSession = Depends(page_session),
               s: Session = Depends(session)) -> Response:
    from batchyard.server.portal import views
    from batchyard.server.portal.pages import render

    return render("sweep.html", request, sess, ws=ws, exp=exp,
                  sweep=sweeps.show(s, ws, exp, name), workspaces=views.workspaces(s),
                  page="experiments")


@router.get("/portal/api" + SWEEP, dependencies=[Depends(data_session)])
def sweep_data(ws: str, exp: str, name: str, s: Session = Depends(session)) -> dict[str, Any]:
    data = sweeps.show(s, ws, exp, name)
    data.pop("spec", None)  # the trial's full spec is on each trial's job page
    return data


def experiment_sweeps(s: Session, ws: str, exp: str) -> list[dict[str, Any]]:
    """The sweeps of an experiment, for its page."""
    return sweeps.list_all(s, ws, exp)
