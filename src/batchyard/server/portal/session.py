"""Portal sign-in: a personal token (or the home's token) once, then a server-side session
behind a cookie. The session remembers who signed in (the user, or the home's token); what
they may see and do is decided per page by its rule (portal.access), from their roles now:
a role taken away or a user disabled counts at the next page.

The cookie holds only a random session id (32 bytes from ``secrets``); what it stands for is
a row of the database (``portal_sessions``, keyed by the id's sha256), so every process of a
``--workers`` server knows it, and it outlives a server restart as it outlives the
browser's (``LIFETIME``). Signing out deletes the row. The cookie is HttpOnly and
SameSite=Strict, and Secure when the request came over https (on plain http://127.0.0.1 a
browser would drop a Secure cookie, so it is left off there). Every state-changing request
carries the session's CSRF token (a synchronizer token: hidden form field or X-CSRF-Token
header) and must come from this origin."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import Request
from fastapi.responses import Response
from sqlalchemy import delete

from batchyard.errors import AuthError
from batchyard.store.db import Database
from batchyard.store.models import PortalSignIn

COOKIE = "batchyard_session"
LIFETIME = 12 * 3600.0
MAX_FORM = 64 * 1024


@dataclass
class PortalSession:
    sid: str
    csrf: str
    expires: float
    user_id: int | None = None
    home_token: bool = False


class SessionStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, user_id: int | None, home_token: bool) -> PortalSession:
        sess = PortalSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32),
                             time.time() + LIFETIME, user_id, home_token)
        with self.db.session() as session:
            session.execute(delete(PortalSignIn).where(PortalSignIn.expires < time.time()))
            session.add(PortalSignIn(sid_hash=_hash(sess.sid), csrf=sess.csrf,
                                     expires=sess.expires, user_id=user_id,
                                     home_token=home_token))
            session.commit()
        return sess

    def get(self, sid: str | None) -> PortalSession | None:
        if not sid or len(sid) > 128:
            return None
        with self.db.session() as session:
            row = session.get(PortalSignIn, _hash(sid))
            if row is None or row.expires < time.time():
                return None
            return PortalSession(sid, row.csrf, row.expires, row.user_id, row.home_token)

    def drop(self, sid: str | None) -> None:
        if not sid:
            return
        with self.db.session() as session:
            session.execute(delete(PortalSignIn).where(PortalSignIn.sid_hash == _hash(sid)))
            session.commit()


def _hash(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


class LoginRequired(Exception):
    """A portal page was asked for without a valid session."""

    def __init__(self, next_url: str, page: bool) -> None:
        super().__init__(next_url)
        self.next_url = next_url
        self.page = page


def store(request: Request) -> SessionStore:
    found: SessionStore | None = getattr(request.app.state, "portal_sessions", None)
    if found is None:
        found = request.app.state.portal_sessions = SessionStore(request.app.state.ctx.db)
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
