"""The FastAPI application: routers, error mapping, OpenAPI. Errors from the rooted tree keep
their code and status; validation errors name the field; anything unexpected is logged and
answered with a generic message (never a traceback)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from batchyard import __version__
from batchyard.errors import BatchyardError, RateLimited
from batchyard.server.context import ServerContext
from batchyard.spec.errors import field_path

log = logging.getLogger("batchyard.server")


def create_app(ctx: ServerContext) -> FastAPI:
    from batchyard.server.routers import (
        agent,
        clusters,
        datastores,
        experiments,
        jobs,
        metrics,
        node,
        quotas,
        sweeps,
        system,
        workspaces,
    )

    app = FastAPI(title="batchyard", version=__version__,
                  description="Clusters and distributed training jobs on machines you own.",
                  openapi_url="/api/v1/openapi.json", docs_url="/api/v1/docs", redoc_url=None)
    app.state.ctx = ctx
    # Routes are matched in order, one regex each: the busiest (submits and job reads, the
    # launchers' and agents' reports) first. No path of one router matches another's.
    for module in (jobs, node, agent, system, workspaces, clusters, experiments, metrics,
                   quotas, datastores, sweeps):
        app.include_router(module.router, prefix="/api/v1")
    from batchyard.server.routers.exec import router as exec_router  # job exec (websocket)

    app.include_router(exec_router, prefix="/api/v1")
    from batchyard.server.routers.stacks import router as stacks_router  # job stacks

    app.include_router(stacks_router, prefix="/api/v1")
    from batchyard.server.portal import errors as portal_errors
    from batchyard.server.portal import install as install_portal

    install_portal(app)  # the web portal at / (cookie sessions; the API keeps bearer tokens)
    from batchyard.server.auditing import AuditMiddleware
    from batchyard.server.routers import chargeback, guarantees, identity, sso, tokens
    from batchyard.server.telemetry.channel_errors import ChannelErrors
    from batchyard.server.telemetry.route import router as metrics_router

    for module in (identity, tokens, sso, chargeback, guarantees):
        app.include_router(module.router, prefix="/api/v1")
    app.add_middleware(AuditMiddleware)
    app.include_router(metrics_router)  # GET /metrics for Prometheus (the scrape token)
    from batchyard.server.mlflow.router import install as install_mlflow

    install_mlflow(app)  # MLflow's tracking REST API at /api/2.0/mlflow (job tokens)

    app.add_middleware(ChannelErrors)
    app.add_middleware(NoNulMiddleware)

    @app.exception_handler(BatchyardError)
    async def _batchyard_error(request: Request, exc: BatchyardError) -> Response:
        request.state.error = exc.message  # the audit entry's detail (server.auditing)
        if portal_errors.is_page(request):
            return portal_errors.error_page(request, exc.http_status, exc.message)
        headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
        if isinstance(exc, RateLimited):
            headers = {"Retry-After": str((exc.details or {}).get("retry_after", 60))}
        return JSONResponse({"error": exc.to_dict()}, status_code=exc.http_status,
                            headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems: list[dict[str, Any]] = []
        for err in exc.errors():
            loc = tuple(x for x in err.get("loc", ()) if x not in ("body", "query", "path"))
            msg = "unknown field" if err.get("type") == "extra_forbidden" else err.get("msg")
            msg = str(msg).removeprefix("Value error, ")
            problems.append({"field": field_path(loc), "message": msg})
        text = "; ".join(p["message"] if p["field"] == "(top level)"
                         else f"{p['field']}: {p['message']}" for p in problems)
        return JSONResponse({"error": {"code": "invalid_request", "message": text,
                                       "details": problems}}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if portal_errors.is_page(request):
            return portal_errors.error_page(request, exc.status_code, str(exc.detail))
        return JSONResponse({"error": {"code": "http_error", "message": str(exc.detail)}},
                            status_code=exc.status_code)

    async def _storage(request: Request, exc: Exception) -> Response:
        """Handled here, not by the catch-all below: Starlette re-raises what reaches that
        one after answering, and the server then drops the client's connection."""
        from batchyard.server import storage_trouble

        cause = storage_trouble.cause_of(exc)
        if cause is None:
            return await _unexpected(request, exc)
        storage_trouble.log_once(log, "storage trouble", exc)  # a line per cause, not per call
        return JSONResponse(storage_trouble.answer(cause), status_code=503,
                            headers={"Retry-After": storage_trouble.RETRY_AFTER})

    from sqlalchemy.exc import SQLAlchemyError

    app.add_exception_handler(SQLAlchemyError, _storage)
    app.add_exception_handler(OSError, _storage)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error")
        if portal_errors.is_page(request):
            return portal_errors.error_page(request, 500, "The server hit an unexpected "
                                            f"error ({type(exc).__name__}); see its log.")
        return JSONResponse({"error": {"code": "internal", "message":
                                       f"internal error ({type(exc).__name__}); see server log"}},
                            status_code=500)

    from batchyard.server.security.permissions import check_routes

    check_routes(app)  # every route declares who may call it
    return app


class NoNulMiddleware:
    """A NUL byte in a name or query is never stored or matched (PostgreSQL's text cannot
    hold one): it is answered before any route looks it up. Plain ASGI, so streamed
    answers (log followers) pass through untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            path = scope.get("path", "")
            answer: JSONResponse | None = None
            if "\0" in path:
                name = next(part for part in path.split("/") if "\0" in part)
                answer = JSONResponse({"error": {
                    "code": "not_found",
                    "message": f"{name!r} not found: names cannot hold NUL bytes"}},
                    status_code=404)
            elif b"%00" in scope.get("query_string", b""):
                answer = JSONResponse({"error": {
                    "code": "invalid_request",
                    "message": "a query parameter holds a NUL byte"}}, status_code=422)
            if answer is not None:
                if scope["type"] == "http":
                    await answer(scope, receive, send)
                else:
                    await send({"type": "websocket.close", "code": 1008})
                return
        await self.app(scope, receive, send)
