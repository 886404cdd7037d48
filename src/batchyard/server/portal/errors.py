"""Error pages for the portal's HTML routes. The server's exception handlers ask here first:
a browser asking for a page gets a portal-styled page with the status and the message, while
the API (``/api/``) and the portal's own data endpoints (``/portal/api/``) keep JSON errors."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse

from batchyard.server.portal import session as sessions

NOT_PAGES = ("/api/", "/portal/api/", "/static/", "/metrics")
TITLES = {400: "Bad request", 401: "Sign in first", 403: "Not allowed", 404: "Not found",
          405: "Not allowed here", 409: "Conflict", 422: "Bad request",
          500: "Something went wrong"}


def is_page(request: Request) -> bool:
    """A request for one of the portal's pages (anything outside the APIs and static files)."""
    path = request.url.path
    return not any(path.startswith(p) for p in NOT_PAGES)


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    from batchyard.server.portal.pages import render

    sess = sessions.current(request) if hasattr(request.app.state, "ctx") else None
    title = TITLES.get(status, "Error")
    if status == 404 and message in ("Not Found", ""):
        message = f"There is no page at {request.url.path}."
    return render("error.html", request, sess, status, status_code=status, title=title,
                  message=message)
