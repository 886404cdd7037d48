"""The portal's HTML pages and its form actions (sign in/out, terminate, delete)."""

from __future__ import annotations

import hmac
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup
from sqlalchemy.orm import Session

from batchyard import __version__
from batchyard.errors import BatchyardError
from batchyard.server.auth import server_context
from batchyard.server.context import ServerContext
from batchyard.server.portal import session as sessions
from batchyard.server.portal import views
from batchyard.server.portal.session import PortalSession, page_session
from batchyard.server.routers.deps import session
from batchyard.server.services import jobs

router = APIRouter(include_in_schema=False)
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY",
           "Cache-Control": "no-store"}


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{seconds:.1f}s"


def stamp(value: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value)) if value else "—"


def when(value: float | None) -> Markup:
    """A time as ``<time>``: the page's script rewrites it in the browser's own zone with the
    same format as the times it adds itself, so one page shows one time format."""
    if not value:
        return Markup("—")
    return Markup('<time data-ts="{}">{}</time>').format(f"{value:.3f}", stamp(value))


def job_url(ws: str, exp: str, name: str) -> str:
    return f"/ws/{quote(ws, safe='')}/exp/{quote(exp, safe='')}/jobs/{quote(name, safe='')}"


def exp_url(ws: str, exp: str) -> str:
    return f"/ws/{quote(ws, safe='')}/exp/{quote(exp, safe='')}"


_env = Environment(loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
                   autoescape=True, trim_blocks=True, lstrip_blocks=True)
_env.filters.update(duration=duration, stamp=stamp, when=when)
_env.globals.update(job_url=job_url, exp_url=exp_url, version=__version__)
_env.policies["json.dumps_kwargs"] = {"sort_keys": False}


def render(name: str, request: Request, sess: PortalSession | None, status: int = 200,
           **values: Any) -> HTMLResponse:
    html = _env.get_template(name).render(request=request, csrf=sess.csrf if sess else "",
                                          signed_in=sess is not None, **values)
    return HTMLResponse(html, status_code=status, headers=HEADERS)


@router.get("/login")
def login_page(request: Request, next: str = "/") -> Response:
    if sessions.current(request) is not None:
        return RedirectResponse(sessions.safe_next(next), status_code=303)
    return render("login.html", request, None, next=sessions.safe_next(next), error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    fields = await sessions.form(request)
    target = sessions.safe_next(fields.get("next"))
    ctx: ServerContext = server_context(request)
    token = fields.get("token", "").strip()
    if not sessions.same_origin(request):
        return render("login.html", request, None, 403, next=target,
                      error="This sign-in did not come from this server's page.")
    if not token or not hmac.compare_digest(token.encode(), ctx.admin_token.encode()):
        return render("login.html", request, None, 401, next=target,
                      error="That token is not valid. It is in $BATCHYARD_HOME/token.")
    def sign_in() -> PortalSession:  # a fresh id, whatever this browser had
        sessions.store(request).drop(request.cookies.get(sessions.COOKIE))
        return sessions.store(request).create()

    sess = await run_in_threadpool(sign_in)
    response = RedirectResponse(target, status_code=303)
    sessions.set_cookie(request, response, sess)
    return response


@router.post("/logout")
async def logout(request: Request, sess: PortalSession = Depends(page_session)) -> Response:
    sessions.check_csrf(request, sess, await sessions.form(request))
    await run_in_threadpool(sessions.store(request).drop, sess.sid)
    response = RedirectResponse("/login", status_code=303)
    sessions.clear_cookie(request, response)
    return response


@router.get("/")
def home(_sess: PortalSession = Depends(page_session)) -> Response:
    return RedirectResponse("/clusters", status_code=303)


@router.get("/clusters")
def clusters_page(request: Request, ws: str = "default",
                  sess: PortalSession = Depends(page_session),
                  s: Session = Depends(session)) -> Response:
    return render("clusters.html", request, sess, ws=ws, workspaces=views.workspaces(s),
                  clusters=views.cluster_views(s, ws), page="clusters")


@router.get("/experiments")
def experiments_page(request: Request, ws: str = "default",
                     sess: PortalSession = Depends(page_session),
                     s: Session = Depends(session)) -> Response:
    return render("experiments.html", request, sess, ws=ws, workspaces=views.workspaces(s),
                  experiments=views.experiment_list(s, ws), states=views.STATES,
                  page="experiments")


@router.get("/jobs")
def jobs_page(request: Request, ws: str = "default", experiment: str = "", state: str = "",
              notice: str = "", sess: PortalSession = Depends(page_session),
              s: Session = Depends(session)) -> Response:
    rows = views.job_rows(s, ws, experiment, state)
    return render("jobs.html", request, sess, ws=ws, workspaces=views.workspaces(s),
                  experiments=views.experiments(s, ws), states=views.STATES,
                  experiment=experiment, state=state, jobs=rows, notice=notice, page="jobs",
                  counts={st: sum(1 for j in rows if j["state"] == st) for st in views.STATES},
                  back="/jobs?" + urlencode({"ws": ws, "experiment": experiment,
                                             "state": state}))


@router.get("/ws/{ws}/exp/{exp}")
def experiment_page(request: Request, ws: str, exp: str, metric: str = "", cursor: str = "",
                    sess: PortalSession = Depends(page_session),
                    s: Session = Depends(session)) -> Response:
    from batchyard.server.portal.sweeps import experiment_sweeps

    view = views.experiment_view(s, ws, exp, cursor or None)
    # a metric logged over steps makes a curve; one logged once per run is a column above
    preferred = view["stepped"] or view["metrics"]
    chosen = metric or (preferred[0] if preferred else "")
    return render("experiment.html", request, sess, ws=ws, exp=exp, view=view, metric=chosen,
                  page="experiments",
                  workspaces=views.workspaces(s), sweeps=experiment_sweeps(s, ws, exp))


@router.get("/ws/{ws}/exp/{exp}/jobs/{name}")
def job_page(request: Request, ws: str, exp: str, name: str, notice: str = "",
             sess: PortalSession = Depends(page_session),
             s: Session = Depends(session)) -> Response:
    job = views.job_view(s, ws, exp, name)
    spec_text = json.dumps(job["spec"], indent=2, default=str)
    return render("job.html", request, sess, ws=ws, exp=exp, job=job, spec_text=spec_text,
                  notice=notice, workspaces=views.workspaces(s), page="jobs")


def _back(fields: dict[str, str], fallback: str, notice: str | None) -> RedirectResponse:
    target = sessions.safe_next(fields.get("back") or fallback)
    if notice:
        target += ("&" if "?" in target else "?") + urlencode({"notice": notice})
    return RedirectResponse(target, status_code=303)


@router.post("/ws/{ws}/exp/{exp}/jobs/{name}/terminate")
async def terminate(request: Request, ws: str, exp: str, name: str,
                    sess: PortalSession = Depends(page_session)) -> Response:
    fields = await sessions.form(request)
    sessions.check_csrf(request, sess, fields)
    ctx: ServerContext = server_context(request)
    notice = None
    try:
        with ctx.db.session() as s:
            done = jobs.terminate(ctx, s, ws, exp, name)
            kick = bool(s.info.get("kick"))
        if kick:
            ctx.kick()
        notice = f"terminate requested for {name} ({done['state']})"
    except BatchyardError as exc:
        notice = exc.message
    return _back(fields, job_url(ws, exp, name), notice)


@router.post("/ws/{ws}/exp/{exp}/jobs/{name}/delete")
async def delete(request: Request, ws: str, exp: str, name: str,
                 sess: PortalSession = Depends(page_session)) -> Response:
    fields = await sessions.form(request)
    sessions.check_csrf(request, sess, fields)
    ctx: ServerContext = server_context(request)
    try:
        with ctx.db.session() as s:
            jobs.delete(s, ws, exp, name)
    except BatchyardError as exc:
        return _back(fields, job_url(ws, exp, name), exc.message)
    fallback = "/jobs?" + urlencode({"ws": ws})
    back = fields.get("back") or fallback
    if back.startswith("/ws/"):
        back = fallback  # the job's own page is gone
    return _back({"back": back}, fallback, f"deleted {name}")
