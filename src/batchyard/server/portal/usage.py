"""The portal's usage page (issue 35 §3): the usage report as a table for the period, and
GPU- and CPU-hours per day (per hour for one day) per team (or user, workspace, cluster,
size) as charts. Built from the usage report service, period by period; a server admin's
page, as the report is."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from batchyard.server.portal.access import Caller, PortalAdmin
from batchyard.server.routers.deps import session
from batchyard.server.services import usage_report

router = APIRouter(include_in_schema=False)
ADMIN = PortalAdmin()
DAY = 86400.0
KINDS = ("gpu_hours", "cpu_hours")


def series(s: Session, by: str, days: int, until: float) -> dict[str, Any]:
    """Per kind, one series per group: ``[[x, hours], ...]`` where x counts periods back
    from now (0: the one ending now); days or, for one day, hours."""
    step = 3600.0 if days == 1 else DAY
    count = 24 if days == 1 else days
    periods = []
    for i in range(count):
        end = until - i * step
        periods.append({str(r[by]): r for r in
                        usage_report.report(s, by, end - step, end)["rows"]})
    names = sorted({name for found in periods for name in found})
    by_kind = {kind: {name: [[-i, round(found[name][kind], 4) if name in found else 0.0]
                             for i, found in reversed(list(enumerate(periods)))]
                      for name in names} for kind in KINDS}
    return {"unit": "hour" if days == 1 else "day",
            "series": {k: [{"name": n, "points": p} for n, p in v.items()]
                       for k, v in by_kind.items()}}


@router.get("/usage")
def usage_page(request: Request, by: str = Query("team", max_length=16),
               days: int = Query(30, ge=1, le=366), caller: Caller = Depends(ADMIN),
               s: Session = Depends(session)) -> Response:
    from batchyard.server.portal.pages import render

    until = time.time()
    report = usage_report.report(s, by, until - days * DAY, until)  # a bad `by`: 422
    return render("usage.html", request, caller, page="usage", by=by, days=days,
                  choices=usage_report.BY, report=report,
                  chart=series(s, by, days, until))
