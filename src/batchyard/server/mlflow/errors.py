"""MLflow's error answers: ``{"error_code": "RESOURCE_DOES_NOT_EXIST", "message": ...}`` with
MLflow's status codes, for every failure on its routes (bad input, a wrong token, a call
batchyard does not implement), so the ``mlflow`` client raises its own clear exception."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from batchyard.errors import AuthError, BatchyardError, Conflict, NotFound
from batchyard.server.routers.deps import CommitRoute
from batchyard.spec.errors import field_path

STATUS = {"INVALID_PARAMETER_VALUE": 400, "BAD_REQUEST": 400, "RESOURCE_DOES_NOT_EXIST": 404,
          "ENDPOINT_NOT_FOUND": 404, "RESOURCE_ALREADY_EXISTS": 400,
          "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "INVALID_STATE": 400,
          "INTERNAL_ERROR": 500, "TEMPORARILY_UNAVAILABLE": 503}


class MlflowError(BatchyardError):
    """An answer in MLflow's shape."""

    def __init__(self, error_code: str, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.http_status = STATUS.get(error_code, 400)


def not_found(what: str) -> MlflowError:
    return MlflowError("RESOURCE_DOES_NOT_EXIST", what)


def invalid(message: str) -> MlflowError:
    return MlflowError("INVALID_PARAMETER_VALUE", message)


def answer(exc: Exception) -> Response:
    """Any failure of an MLflow route, in MLflow's shape."""
    if isinstance(exc, MlflowError):
        code = exc.error_code
    elif isinstance(exc, AuthError):
        code = "UNAUTHENTICATED" if exc.http_status == 401 else "PERMISSION_DENIED"
    elif isinstance(exc, NotFound):
        code = "RESOURCE_DOES_NOT_EXIST"
    elif isinstance(exc, Conflict):
        code = "INVALID_STATE"
    elif isinstance(exc, BatchyardError) and exc.http_status == 503:
        code = "TEMPORARILY_UNAVAILABLE"
    elif isinstance(exc, BatchyardError):
        code = "INVALID_PARAMETER_VALUE"
    else:
        raise exc
    message = exc.message if isinstance(exc, BatchyardError) else str(exc)
    headers = {"WWW-Authenticate": "Bearer"} if code == "UNAUTHENTICATED" else None
    return JSONResponse({"error_code": code, "message": message},
                        status_code=STATUS.get(code, 400), headers=headers)


def _validation(exc: RequestValidationError) -> Response:
    problems = []
    for err in exc.errors():
        loc = tuple(x for x in err.get("loc", ()) if x not in ("body", "query", "path"))
        problems.append(f"{field_path(loc)}: {str(err.get('msg')).removeprefix('Value error, ')}")
    return JSONResponse({"error_code": "INVALID_PARAMETER_VALUE",
                         "message": "; ".join(problems) or "invalid request"}, status_code=400)


class MlflowRoute(CommitRoute):
    """A route whose every error (its dependencies' too: the token check) is MLflow's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return _validation(exc)
            except BatchyardError as exc:
                return answer(exc)

        return handle


def endpoint_not_found(method: str, path: str) -> Response:
    body: dict[str, Any] = {"error_code": "ENDPOINT_NOT_FOUND",
                            "message": f"{method} {path}: this MLflow API call is not one "
                            "batchyard's tracking server implements (metrics, params, tags, "
                            "runs, experiments, logged models and artifacts are)"}
    return JSONResponse(body, status_code=404)
