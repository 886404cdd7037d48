"""Portal sign-in: the admin token once, then a server-side session behind a cookie.

The cookie holds only a random session id (32 bytes from ``secrets``); what it stands for lives
in this process's memory, so a server restart signs everyone out. The cookie is HttpOnly and
SameSite=Strict, and Secure when the request came over https (on plain http://127.0.0.1 a
browser would drop a Secure cookie, so it is left off there). Every state-changing request
carries the session's CSRF token (a synchronizer token: hidden form field or X-CSRF-Token
header) and must come from this origin."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import Request
from fastapi.responses import Response

from batchyard.errors import AuthError

COOKIE = "batchyard_session"
LIFETIME = 12 * 3600.0
MAX_FORM = 64 * 1024


@dataclass
class PortalSession:
    sid: str
    csrf: str
    expires: float


@dataclass
class SessionStore:
    sessions: dict[str, PortalSession] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def create(self) -> PortalSession:
        sess = PortalSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32),
                             time.time() + LIFETIME)
        with self.lock:
            stamp = time.time()
            for sid in [k for k, v in self.sessions.items() if v.expires < stamp]:
                del self.sessions[sid]
            self.sessions[sess.sid] = sess
        return sess

    def get(self, sid: str | None) -> PortalSession | None:
        if not sid:
            return None
        with self.lock:
            sess = self.sessions.get(sid)
            if sess is None or sess.expires < time.time():
                self.sessions.pop(sid, None)
                return None
            return sess

    def drop(self, sid: str | None) -> None:
        with self.lock:
            self.sessions.pop(sid or "", None)


class LoginRequired(Exception):
    """A portal page was asked for without a valid session."""

    def __init__(self, next_url: str, page: bool) -> None:
        super().__init__(next_url)
        self.next_url = next_url
        self.page = page


def store(request: Request) -> SessionStore:
    found: SessionStore = request.app.state.portal_sessions
    return found


def current(request: Request) -> PortalSession | None:
    return store(request).get(request.cookies.get(COOKIE))


def page_session(request: Request) -> PortalSession:
    """Dependency of HTML pages: no session → redirect to the sign-in page."""
    sess = current(request)
    if sess is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target, page=True)
    return sess


def data_session(request: Request) -> PortalSession:
    """Dependency of the portal's data endpoints: no session → 401."""
    sess = current(request)
    if sess is None:
        raise LoginRequired(request.url.path, page=False)
    return sess


def login_url(next_url: str) -> str:
    return "/login?next=" + quote(safe_next(next_url), safe="/")


def safe_next(value: str | None) -> str:
    """Only a local path: never an open redirect to another site."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def same_origin(request: Request) -> bool:
    """The browser says where a POST came from; it must be this server."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return False
    parts = urlsplit(origin)
    host = request.headers.get("host", "")
    return parts.scheme in ("http", "https") and parts.netloc == host


async def form(request: Request) -> dict[str, str]:
    """An urlencoded form body (parsed here: no multipart dependency needed)."""
    body = await request.body()
    if len(body) > MAX_FORM:
        raise AuthError("form too large")
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


def check_csrf(request: Request, sess: PortalSession, fields: dict[str, str] | None) -> None:
    given = request.headers.get("x-csrf-token") or (fields or {}).get("csrf", "")
    if not same_origin(request) or not hmac.compare_digest(given.encode(), sess.csrf.encode()):
        raise CsrfError("missing or wrong CSRF token: reload the page and try again")


class CsrfError(AuthError):
    code = "csrf"
    http_status = 403


def set_cookie(request: Request, response: Response, sess: PortalSession) -> None:
    response.set_cookie(COOKIE, sess.sid, max_age=int(LIFETIME), path="/", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")


def clear_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
