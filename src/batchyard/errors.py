"""One rooted error tree. Every error carries a stable code and an HTTP status so the API can
send it as-is and the CLI can turn it into a one-line message and exit code 2."""

from __future__ import annotations

TYPE_CHECKING = False  # (typing itself is not imported: the CLI's start-up)
if TYPE_CHECKING:
    from typing import Any


class BatchyardError(Exception):
    code = "error"
    http_status = 500

    def __init__(self, message: str, *, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            body["details"] = self.details
        return body


class UserError(BatchyardError):
    """Errors caused by what the caller asked for; the CLI exits 2 on these."""

    code = "bad_request"
    http_status = 400


class SpecError(UserError):
    code = "invalid_spec"
    http_status = 422


class NotFound(UserError):
    code = "not_found"
    http_status = 404


class Conflict(UserError):
    code = "conflict"
    http_status = 409


class NoCapacity(Conflict):
    """The machine cannot give a node what its size asks for (its GPUs are all taken)."""

    code = "no_capacity"


class Unschedulable(UserError):
    """The job can never run on its cluster (more nodes or slots than it can ever have)."""

    code = "unschedulable"
    http_status = 422


class QuotaExceeded(UserError):
    code = "quota_exceeded"
    http_status = 422


class Unsupported(UserError):
    """A property that cannot be honoured here (e.g. a container with no container runtime)."""

    code = "unsupported"
    http_status = 422


class AuthError(BatchyardError):
    """No credential, or one that is not valid (unknown, expired, revoked, a disabled
    user's): 401."""

    code = "unauthorized"
    http_status = 401


class Forbidden(AuthError):
    """A valid credential without the right to do this (a missing role): 403, naming what
    is needed. The CLI exits 5 on it."""

    code = "forbidden"
    http_status = 403


class RateLimited(AuthError):
    """Too many failed sign-ins from one address: wait, then try again."""

    code = "rate_limited"
    http_status = 429


class ServerUnavailable(BatchyardError):
    code = "server_unavailable"
    http_status = 503


class BackendError(BatchyardError):
    code = "backend_error"
    http_status = 502


_BY_CODE: dict[str, type[BatchyardError]] = {}


def _register(cls: type[BatchyardError]) -> None:
    _BY_CODE[cls.code] = cls
    for sub in cls.__subclasses__():
        _register(sub)


_register(BatchyardError)


def from_dict(body: dict[str, Any], status: int) -> BatchyardError:
    """Rebuild the error the server raised, so client code can catch NotFound etc."""
    cls = _BY_CODE.get(str(body.get("code")))
    if cls is None:  # a code this client does not know: the status says whose fault it is
        cls = Forbidden if status == 403 else AuthError if status in (401, 429) \
            else UserError if 400 <= status < 500 \
            else ServerUnavailable if status == 503 else BatchyardError
    err = cls(str(body.get("message", f"HTTP {status}")), details=body.get("details"))
    err.http_status = status
    return err
