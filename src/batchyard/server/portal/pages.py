"""The portal's HTML pages and its form actions (sign in/out, terminate, delete). Each
declares its rule (portal.access): what a user sees follows their roles."""

from __future__ import annotations

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
from batchyard.errors import AuthError, BatchyardError, RateLimited
from batchyard.server.auth import server_context
from batchyard.server.context import ServerContext
from batchyard.server.portal import session as sessions
from batchyard.server.portal import views
from batchyard.server.portal.access import Caller, PortalRule
from batchyard.server.portal.session import PortalSession
from batchyard.server.routers.deps import session
from batchyard.server.security import authn
from batchyard.server.security.permissions import Public
from batchyard.server.security.principal import Principal, Role
from batchyard.server.services import jobs
from batchyard.server.services.audit import Note

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
SIGNED_IN = PortalRule(None, page=True)
LISTING = PortalRule(Role.reader, page=True, any_ws=True)  # a page whose ?ws= is optional
READ = PortalRule(Role.reader, page=True)
_env.policies["json.dumps_kwargs"] = {"sort_keys": False}


def render(name: str, request: Request, sess: PortalSession | Caller | None,
           status: int = 200, **values: Any) -> HTMLResponse:
    caller = sess if isinstance(sess, Caller) else None
    plain = caller.sess if caller else sess
    html = _env.get_template(name).render(
        request=request, csrf=plain.csrf if isinstance(plain, PortalSession) else "",
        signed_in=plain is not None, who=caller.who if caller else None,
        may_manage=caller.may_manage if caller else (lambda ws, job: False), **values)
    return HTMLResponse(html, status_code=status, headers=HEADERS)


def visible_workspaces(caller: Caller, s: Session) -> list[str]:
    return caller.workspaces(views.workspaces(s))


def _pick(caller: Caller, s: Session, ws: str | None) -> str:
    """The page's workspace: the one asked for (its rule checked it), else ``default`` when
    the user may see it, else the first they may see."""
    if ws:
        return ws
    names = visible_workspaces(caller, s)
    if not names:
        raise NoWorkspace(f"user {caller.who.name!r} has no role in any workspace yet: ask a "
                          "workspace's owner or a server admin to assign one")
    return "default" if "default" in names else names[0]


class NoWorkspace(AuthError):
    code = "forbidden"
    http_status = 403


@router.get("/login", dependencies=[Depends(Public("the sign-in page itself"))])
def login_page(request: Request, next: str = "/") -> Response:
    from batchyard.server.portal.access import signed_in

    sess, who = signed_in(server_context(request), request)
    if who is not None:
        return RedirectResponse(sessions.safe_next(next), status_code=303)
    error = None
    if sess is not None:  # a session whose user is disabled or gone: it ends here
        sessions.store(request).drop(sess.sid)
        error = "Your session has ended (your user was disabled or removed)."
    response = render("login.html", request, None, next=sessions.safe_next(next), error=error)
    if sess is not None:
        sessions.clear_cookie(request, response)
    return response


@router.post("/login", dependencies=[Depends(Public("signing in: the form carries the "
                                                    "token, checked here"))])
async def login(request: Request) -> Response:
    """A personal token (no service account's) or the home's token; failures are audited
    and rate-limited as the API's are."""
    fields = await sessions.form(request)
    target = sessions.safe_next(fields.get("next"))
    ctx: ServerContext = server_context(request)
    token = fields.get("token", "").strip()
    if not sessions.same_origin(request):
        return render("login.html", request, None, 403, next=target,
                      error="This sign-in did not come from this server's page.")
    try:
        who = await _signed_in_as(request, ctx, token)
    except BatchyardError as exc:
        return render("login.html", request, None, exc.http_status, next=target,
                      error=exc.message)

    def sign_in() -> PortalSession:  # a fresh id, whatever this browser had
        sessions.store(request).drop(request.cookies.get(sessions.COOKIE))
        home = who.credential == authn.HOME
        return sessions.store(request).create(None if home else who.user_id, home)

    sess = await run_in_threadpool(sign_in)
    response = RedirectResponse(target, status_code=303)
    sessions.set_cookie(request, response, sess)
    return response


async def _signed_in_as(request: Request, ctx: ServerContext, token: str) -> Principal:
    if not token:
        raise AuthError("Paste a personal token (`batchyard token create`), or the admin "
                        "token from $BATCHYARD_HOME/token.")
    try:
        who = await authn.authenticate(request, ctx, jobs=False, token=token)
    except RateLimited:
        raise
    except AuthError as exc:
        raise AuthError(f"That token is not valid here ({exc.message}). Use a personal token "
                        "(`batchyard token create`), or the admin token from "
                        "$BATCHYARD_HOME/token.") from None
    request.state.audit = Note(action="portal.login", actor=who.name,
                               credential=who.credential, client=authn.client_of(request))
    if who.service:
        raise AuthError(f"{who.name!r} is a service account: it cannot sign in to the portal")
    return who


@router.post("/logout")
async def logout(request: Request,
                 caller: Caller = Depends(PortalRule(None, page=True, action="portal.logout"))
                 ) -> Response:
    sessions.check_csrf(request, caller.sess, await sessions.form(request))
    await run_in_threadpool(sessions.store(request).drop, caller.sess.sid)
    response = RedirectResponse("/login", status_code=303)
    sessions.clear_cookie(request, response)
    return response


@router.get("/", dependencies=[Depends(SIGNED_IN)])
def home() -> Response:
    return RedirectResponse("/clusters", status_code=303)


@router.get("/clusters")
def clusters_page(request: Request, ws: str | None = None,
                  caller: Caller = Depends(LISTING), s: Session = Depends(session)) -> Response:
    ws = _pick(caller, s, ws)
    return render("clusters.html", request, caller, ws=ws,
                  workspaces=visible_workspaces(caller, s),
                  clusters=views.cluster_views(s, ws), page="clusters")


@router.get("/experiments")
def experiments_page(request: Request, ws: str | None = None,
                     caller: Caller = Depends(LISTING),
                     s: Session = Depends(session)) -> Response:
    ws = _pick(caller, s, ws)
    return render("experiments.html", request, caller, ws=ws,
                  workspaces=visible_workspaces(caller, s),
                  experiments=views.experiment_list(s, ws), states=views.STATES,
                  page="experiments")


@router.get("/jobs")
def jobs_page(request: Request, ws: str | None = None, experiment: str = "", state: str = "",
              notice: str = "", caller: Caller = Depends(LISTING),
              s: Session = Depends(session)) -> Response:
    ws = _pick(caller, s, ws)
    rows = views.job_rows(s, ws, experiment, state)
    return render("jobs.html", request, caller, ws=ws,
                  workspaces=visible_workspaces(caller, s),
                  experiments=views.experiments(s, ws), states=views.STATES,
                  experiment=experiment, state=state, jobs=rows, notice=notice, page="jobs",
                  counts={st: sum(1 for j in rows if j["state"] == st) for st in views.STATES},
                  back="/jobs?" + urlencode({"ws": ws, "experiment": experiment,
                                             "state": state}))


@router.get("/ws/{ws}/exp/{exp}")
def experiment_page(request: Request, ws: str, exp: str, metric: str = "", cursor: str = "",
                    caller: Caller = Depends(READ), s: Session = Depends(session)) -> Response:
    from batchyard.server.portal.sweeps import experiment_sweeps

    view = views.experiment_view(s, ws, exp, cursor or None)
    # a metric logged over steps makes a curve; one logged once per run is a column above
    preferred = view["stepped"] or view["metrics"]
    chosen = metric or (preferred[0] if preferred else "")
    return render("experiment.html", request, caller, ws=ws, exp=exp, view=view,
                  metric=chosen, page="experiments",
                  workspaces=visible_workspaces(caller, s),
                  sweeps=experiment_sweeps(s, ws, exp))


@router.get("/ws/{ws}/exp/{exp}/jobs/{name}")
def job_page(request: Request, ws: str, exp: str, name: str, notice: str = "",
             caller: Caller = Depends(READ), s: Session = Depends(session)) -> Response:
    job = views.job_view(s, ws, exp, name)
    spec_text = json.dumps(job["spec"], indent=2, default=str)
    return render("job.html", request, caller, ws=ws, exp=exp, job=job, spec_text=spec_text,
                  notice=notice, workspaces=visible_workspaces(caller, s), page="jobs")


def _back(fields: dict[str, str], fallback: str, notice: str | None) -> RedirectResponse:
    target = sessions.safe_next(fields.get("back") or fallback)
    if notice:
        target += ("&" if "?" in target else "?") + urlencode({"notice": notice})
    return RedirectResponse(target, status_code=303)


def _manage(action: str) -> PortalRule:
    return PortalRule(Role.contributor, page=True, action=action, own=True)


def _failed(request: Request, exc: BatchyardError) -> str:
    """A form action's error becomes the page's notice; its audit entry says so."""
    request.state.error = exc.message
    request.state.audit_status = exc.http_status
    return exc.message


@router.post("/ws/{ws}/exp/{exp}/jobs/{name}/terminate")
async def terminate(request: Request, ws: str, exp: str, name: str,
                    caller: Caller = Depends(_manage("job.terminate"))) -> Response:
    fields = await sessions.form(request)
    sessions.check_csrf(request, caller.sess, fields)
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
        notice = _failed(request, exc)
    return _back(fields, job_url(ws, exp, name), notice)


@router.post("/ws/{ws}/exp/{exp}/jobs/{name}/delete")
async def delete(request: Request, ws: str, exp: str, name: str,
                 caller: Caller = Depends(_manage("job.delete"))) -> Response:
    fields = await sessions.form(request)
    sessions.check_csrf(request, caller.sess, fields)
    ctx: ServerContext = server_context(request)
    try:
        with ctx.db.session() as s:
            jobs.delete(s, ws, exp, name)
    except BatchyardError as exc:
        return _back(fields, job_url(ws, exp, name), _failed(request, exc))
    fallback = "/jobs?" + urlencode({"ws": ws})
    back = fields.get("back") or fallback
    if back.startswith("/ws/"):
        back = fallback  # the job's own page is gone
    return _back({"back": back}, fallback, f"deleted {name}")
