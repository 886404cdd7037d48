"""The web portal, served by the batchyard server itself: clusters, jobs, live logs and metric
charts. Jinja2 templates (autoescaped), hand-written CSS and JS, no third-party front-end code.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from batchyard.server.portal.session import LoginRequired, login_url

STATIC = Path(__file__).parent / "static"


def install(app: FastAPI) -> None:
    """Add the portal's pages, data endpoints and static files to the server's app."""
    from batchyard.server.portal import data, links, pages, sso, sweeps, tensorboard, usage

    app.include_router(links.api, prefix="/api/v1")  # one-time sign-in links (portal --open)
    app.include_router(links.pages)
    app.include_router(pages.router)
    app.include_router(sso.router)
    app.include_router(data.router)
    app.include_router(sweeps.router)
    app.include_router(usage.router)
    app.include_router(tensorboard.router)  # a job's TensorBoard, behind the sign-in
    app.mount("/static/portal", StaticFiles(directory=STATIC), name="portal-static")

    @app.exception_handler(LoginRequired)
    async def _login(_request: Request, exc: LoginRequired) -> Response:
        if exc.page:
            return RedirectResponse(login_url(exc.next_url), status_code=303)
        return JSONResponse({"error": {"code": "unauthorized", "message": "sign in first"}},
                            status_code=401)

