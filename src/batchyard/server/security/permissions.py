"""Authorisation, declared once per route, next to it (as dstack's
``server/security/permissions.py``): every route of the API takes one ``Rule`` as a
dependency (a WebSocket route names it with ``@requires``), and ``check_routes`` refuses
an application with a route that has none.

A rule answers 401 for no credential or one that is not valid, 403 for a valid one without
the right (naming the role needed), and never looks further: what a refused caller asked
for is neither read nor revealed (a workspace the caller may not see is a 403 whether it
exists or not). A caller who may see the workspace then gets the route's own answer (a
404 for a missing job). Service functions take what the rule allowed and never decide who
may call them.

Rules by label (``label``: what the route-by-caller test and the README call them):

* ``public`` - anyone (the CA certificate, the sign-in methods, an agent's join, which
  carries its join token in its body);
* ``signed-in`` - any user or service account; ``person`` - a user who is no service
  account (interactive sign-ins);
* ``admin`` - a server admin;
* ``reader`` / ``contributor`` / ``owner`` - that role or higher in the route's workspace;
* ``contributor-own`` - a contributor on the jobs (sweeps) they submitted, an owner on any;
* ``+job`` - also a job token, on its own job only; ``admin+job`` - a server admin or a job
  token (MLflow's tracking API: the service holds the token to its own job's run);
* ``scrape`` - Prometheus (server/scrape_auth.py: the scrape token, or loopback);
* ``node`` / ``launcher`` - a machine's agent for its own node, a node launcher for its own
  attempt and node (rules of the node channel's routers)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.params import Depends as DependsParam
from fastapi.routing import APIRoute, APIWebSocketRoute
from fastapi.security import HTTPBearer
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from batchyard.errors import Forbidden
from batchyard.server.context import ServerContext
from batchyard.server.security import authn
from batchyard.server.security.principal import Principal, Role
from batchyard.server.services.audit import Note
from batchyard.store.models import Experiment, Job, Sweep, Workspace

READS = ("GET", "HEAD", "OPTIONS")
Target = Callable[[dict[str, Any], dict[str, Any]], str | None]
F = TypeVar("F", bound=Callable[..., Any])


class Rule:
    """The base of every rule: a FastAPI dependency that answers the ``Principal`` it let
    through (None for ``public``). ``action`` names the call in the audit trail (a call
    that changes something is recorded with its outcome); ``target`` makes the target's
    name from the path's and the body's fields (default: the path's, after the
    workspace)."""

    label = "?"
    jobs = False  # job tokens (for their own job) pass

    def __init__(self, action: str | None = None, *, target: Target | None = None,
                 audit_jobs: bool = False) -> None:
        self.action = action
        self.target = target
        self.audit_jobs = audit_jobs

    async def __call__(self, request: Request) -> Principal | None:
        return await self.check(request)

    async def check(self, conn: HTTPConnection) -> Principal | None:
        ctx: ServerContext = conn.app.state.ctx
        who = await authn.authenticate(conn, ctx, jobs=self.jobs)
        await self.allow(conn, ctx, who)
        await self.note(conn, who)
        return who

    async def allow(self, conn: HTTPConnection, ctx: ServerContext, who: Principal) -> None:
        """Raise ``Forbidden`` when ``who`` may not make this call."""

    async def note(self, conn: HTTPConnection, who: Principal) -> None:
        method = "WEBSOCKET" if conn.scope["type"] == "websocket" else conn.scope.get(
            "method", "GET")
        if self.action is None or method in READS or (who.kind == "job" and
                                                      not self.audit_jobs):
            return
        conn.state.audit = Note(action=self.action, actor=who.name, credential=who.credential,
                                target=await self._target(conn), client=authn.client_of(conn),
                                workspace=conn.path_params.get("ws"))

    async def _target(self, conn: HTTPConnection) -> str | None:
        params = dict(conn.path_params)
        if self.target is not None:
            body: Any = {}
            if isinstance(conn, Request) and conn.headers.get("content-type", "").startswith(
                    "application/json"):
                try:
                    body = await conn.json()
                except ValueError:
                    body = {}
            return self.target(params, body if isinstance(body, dict) else {})
        parts = [str(v) for k, v in params.items() if k != "ws"]
        return "/".join(parts) or None

    def deny(self, conn: HTTPConnection, who: Principal, message: str,
             **details: Any) -> Forbidden:
        reads = conn.scope.get("method") in READS
        target = "/".join(str(v) for k, v in conn.path_params.items() if k != "ws")
        conn.state.audit = Note(action=self.action or ("read" if reads else "call"),
                                actor=who.name, credential=who.credential,
                                target=target or conn.url.path,
                                workspace=conn.path_params.get("ws"),
                                client=authn.client_of(conn), detail=message)
        return Forbidden(message, details=details or None)


class Public(Rule):
    label = "public"

    def __init__(self, why: str, action: str | None = None) -> None:
        super().__init__(action)
        self.why = why  # said here, at the route, so that nobody wonders

    async def check(self, conn: HTTPConnection) -> Principal | None:
        return None


class _Bearer(Rule, HTTPBearer):
    """A rule that takes a bearer token (named as the API's security scheme)."""

    def __init__(self, action: str | None = None, *, target: Target | None = None,
                 audit_jobs: bool = False) -> None:
        HTTPBearer.__init__(self, auto_error=False, scheme_name="HTTPBearer",
                            description="A personal token, or the token in "
                            "$BATCHYARD_HOME/token")
        Rule.__init__(self, action, target=target, audit_jobs=audit_jobs)

    async def __call__(self, request: Request) -> Principal | None:  # type: ignore[override]
        return await self.check(request)


class SignedIn(_Bearer):
    """Any user or service account (no job token, no node credential)."""

    label = "signed-in"


class Person(SignedIn):
    """A user who signs in interactively (`batchyard login`, the portal): no service
    account, which uses its tokens as they are."""

    label = "person"

    async def allow(self, conn: HTTPConnection, ctx: ServerContext, who: Principal) -> None:
        if who.service:
            raise self.deny(conn, who, f"{who.name!r} is a service account: it cannot sign "
                            "in interactively; use its token as it is (BATCHYARD_TOKEN)",
                            needed="person")


class Admin(_Bearer):
    label = "admin"

    async def allow(self, conn: HTTPConnection, ctx: ServerContext, who: Principal) -> None:
        if not who.admin:
            raise self.deny(conn, who, f"this call ({self.action or conn.url.path}) needs a "
                            f"server admin; user {who.name!r} is not one", needed="admin")


class AdminOrJob(_Bearer):
    """A server admin, or a job token (which the service then holds to its own job): MLflow's
    tracking API, whose paths name runs, not workspaces."""

    label = "admin+job"
    jobs = True

    async def allow(self, conn: HTTPConnection, ctx: ServerContext, who: Principal) -> None:
        if who.kind != "job" and not who.admin:
            raise self.deny(conn, who, f"this call ({self.action or conn.url.path}) is a "
                            "job's (its MLFLOW_TRACKING_TOKEN) or a server admin's; user "
                            f"{who.name!r} is neither", needed="admin")


class InWorkspace(_Bearer):
    """A role (or higher) in the route's workspace (its ``ws`` path parameter, else the
    ``ws`` query parameter, default ``default``). ``own``: a contributor only on the jobs
    (or sweeps) they submitted. ``jobs``: a job token on its own job. ``admin_if``: given
    the body, why this call needs an admin after all (None: it does not)."""

    def __init__(self, role: Role, action: str | None = None, *, own: bool = False,
                 jobs: bool = False, admin_if: Callable[[dict[str, Any]], str | None] | None
                 = None, target: Target | None = None, audit_jobs: bool = False) -> None:
        super().__init__(action, target=target, audit_jobs=audit_jobs)
        self.role = role
        self.own = own
        self.jobs = jobs
        self.admin_if = admin_if
        self.label = ("contributor-own" if own else role.name) + ("+job" if jobs else "")

    async def allow(self, conn: HTTPConnection, ctx: ServerContext, who: Principal) -> None:
        ws = workspace_of(conn)
        if who.kind == "job":
            params = conn.path_params
            if who.job_path != (ws, params.get("exp"), params.get("name")):
                raise self.deny(conn, who, "a job token reaches only its own job (its "
                                "metrics, tags and exec), and nothing else")
            return
        have = who.role_in(ws)
        if have is None or have < self.role:
            raise self.deny(
                conn, who, f"user {who.name!r} has "
                f"{'the role ' + have.name if have else 'no role'} in workspace {ws!r}; this "
                f"call ({self.action or conn.url.path}) needs the role {self.role.name} (or "
                "higher): ask an owner of the workspace or a server admin", needed=self.role.name,
                workspace=ws, role=have.name if have else None)
        if self.admin_if is not None and not who.admin:
            body = await conn.json() if isinstance(conn, Request) else {}
            why = self.admin_if(body if isinstance(body, dict) else {})
            if why:
                raise self.deny(conn, who, f"{why} needs a server admin; user {who.name!r} "
                                "is not one", needed="admin")
        if self.own and have < Role.owner:
            submitters = await run_in_threadpool(_submitters, ctx, conn)
            strangers = sorted(s or "(unknown)" for s in submitters if s != who.name)
            if strangers:
                raise self.deny(
                    conn, who, f"{conn.path_params.get('name')!r} was submitted by "
                    f"{', '.join(strangers)}, not by {who.name!r}: a contributor acts only on "
                    f"their own jobs; this call ({self.action}) on anyone's needs the role "
                    f"owner in workspace {ws!r}", needed=Role.owner.name, workspace=ws,
                    role=have.name)


class Launcher(_Bearer):
    """A node launcher's credential, for its own attempt and node rank (a MAC: no database
    read). Answers the server's context, which the node channel's routes work with."""

    label = "launcher"

    async def check(self, conn: HTTPConnection) -> Any:
        from batchyard.errors import AuthError
        from batchyard.server.services.channel import check_launcher

        ctx: ServerContext = conn.app.state.ctx
        token = authn.bearer(conn.headers.get("authorization"))
        if token is None:
            raise AuthError("missing bearer token: a node launcher's credential")
        rank = str(conn.path_params.get("node_rank", ""))
        check_launcher(ctx, token, str(conn.path_params.get("attempt", "")),
                       int(rank) if rank.isdigit() else -1)
        return ctx


class NodeAgent(_Bearer):
    """A machine's node credential (``batchyard agent``), for its own node. Answers the
    node's id."""

    label = "node"

    async def check(self, conn: HTTPConnection) -> Any:
        from batchyard.server.services.agents import node_for

        ctx: ServerContext = conn.app.state.ctx
        token = authn.bearer(conn.headers.get("authorization")) or ""
        node = str(conn.path_params.get("node", ""))

        def find() -> int:
            with ctx.db.session() as s:
                return node_for(s, token, node).id

        return await run_in_threadpool(find)


def workspace_of(conn: HTTPConnection) -> str:
    return str(conn.path_params.get("ws") or conn.query_params.get("ws") or "default")


def _submitters(ctx: ServerContext, conn: HTTPConnection) -> set[str | None]:
    """Who submitted the job (every job of an array of that name), or made the sweep, the
    path names; empty when there is none (the route then says it is not found)."""
    params = conn.path_params
    ws, exp, name = workspace_of(conn), params.get("exp"), params.get("name")
    with ctx.db.session() as s:
        if "/sweeps/" in conn.url.path:
            query = (select(Sweep.created_by).join(Experiment, Experiment.id ==
                                                   Sweep.experiment_id)
                     .join(Workspace, Workspace.id == Sweep.workspace_id)
                     .where(Workspace.name == ws, Experiment.name == exp, Sweep.name == name))
            return set(s.scalars(query))
        base = (select(Job.created_by).join(Experiment, Experiment.id == Job.experiment_id)
                .join(Workspace, Workspace.id == Job.workspace_id)
                .where(Workspace.name == ws, Experiment.name == exp))
        found = set(s.scalars(base.where(Job.name == name)))
        return found or set(s.scalars(base.where(Job.array_name == name)))


def requires(rule: Rule) -> Callable[[F], F]:
    """The rule of a WebSocket route, which checks it itself before the handshake (a
    refusal must be an HTTP answer, not a closed socket)."""
    def mark(endpoint: F) -> F:
        endpoint.__batchyard_rule__ = rule  # type: ignore[attr-defined]
        return endpoint

    return mark


def rule_of(route: Any) -> Rule | None:
    """The rule a route declares (None: it declares none)."""
    route = getattr(route, "original_route", None) or route
    marked = getattr(getattr(route, "endpoint", None), "__batchyard_rule__", None)
    if isinstance(marked, Rule):
        return marked
    dependant = getattr(route, "dependant", None)
    return _find(dependant) if dependant is not None else None


def _find(dependant: Any) -> Rule | None:
    for sub in _walk(dependant):
        if isinstance(sub.call, Rule):
            return sub.call
    return None


def _walk(dependant: Any) -> Iterator[Any]:
    for sub in dependant.dependencies:
        yield sub
        yield from _walk(sub)


FRAMEWORK = {"/api/v1/openapi.json": "public", "/api/v1/docs": "public",
             "/docs/oauth2-redirect": "public"}


def _flat(routes: list[Any]) -> Iterator[Any]:
    """Every route of the table, those of included routers included (FastAPI keeps an
    included router as one entry that resolves its routes on demand)."""
    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:
            yield from contexts()
        else:
            yield route


def route_rules(app: FastAPI) -> list[tuple[str, str, str]]:
    """(method, path, rule label) of every route of ``app``; a route without a rule has
    the label ``MISSING``. Mounts (static files) are public."""
    found = []
    for route in _flat(app.routes):
        original = getattr(route, "original_route", None) or route
        path = (getattr(route, "path", "") or getattr(getattr(route, "starlette_route", None),
                                                      "path", "") or original.path)
        if isinstance(original, APIRoute | APIWebSocketRoute):
            rule = rule_of(route)
            label = rule.label if rule is not None else "MISSING"
            methods = sorted(getattr(route, "methods", None) or ["WEBSOCKET"])
            found += [(m, path, label) for m in methods if m != "HEAD"]
        elif path in FRAMEWORK:
            found += [(m, path, FRAMEWORK[path]) for m in sorted(route.methods or ["GET"])
                      if m != "HEAD"]
        elif type(route).__name__ == "Mount":
            found.append(("GET", path + "/{path}", "public"))
        else:
            found.append(("?", path, "MISSING"))
    return found


def check_routes(app: FastAPI) -> None:
    """Refuse an application with a route that declares no rule."""
    missing = [f"{m} {p}" for m, p, label in route_rules(app) if label == "MISSING"]
    if missing:
        raise RuntimeError("routes without an authorisation rule (declare one with "
                           "batchyard.server.security.permissions): " + ", ".join(missing))


def depends(rule: Rule) -> Any:
    """``Depends(rule)``, for a route's ``dependencies=[...]``."""
    return DependsParam(rule)
