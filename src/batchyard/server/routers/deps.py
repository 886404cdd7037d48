"""Shared router dependencies: one database session (one transaction) per request.

The transaction commits when the route function returns, before the response is sent
(``scope="function"``): a client that reads right after a write must see it, and a commit
that fails must fail the request. (With FastAPI's default request scope the commit ran after
the response had gone out, so a create-then-get could answer 404.) Routers use ``CommitRoute``
so that the commit runs in the endpoint's own worker thread (see ``_commit_in_worker``).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import Depends
from fastapi.routing import APIRoute
from pydantic import AfterValidator
from sqlalchemy.orm import Session

from batchyard.server.auth import context
from batchyard.server.context import ServerContext

# What the database's integer columns hold (Integer is 32 bits on PostgreSQL; SQLite's
# driver refuses more than 64): a bigger number in a body or a query is a 422 naming it,
# not an OverflowError.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # workspace, experiment, cluster, job


def _name_of(kind: str) -> Callable[[str | None], str | None]:
    def check(value: str | None) -> str | None:
        if value is not None and not re.match(NAME_PATTERN, value):
            raise ValueError(f"{kind} name {value!r} is invalid: use 1-64 letters, digits, "
                             "'.', '_' or '-', starting with a letter or digit")
        return value

    return check


# Optional name fields of request bodies, checked as the services check names.
ExperimentName = Annotated[str | None, AfterValidator(_name_of("experiment"))]
ClusterName = Annotated[str | None, AfterValidator(_name_of("cluster"))]
JobName = Annotated[str | None, AfterValidator(_name_of("job"))]

def _transaction(ctx: ServerContext = Depends(context)) -> Iterator[Session]:
    with ctx.db.session() as s:
        yield s
    if s.info.get("kick"):
        ctx.kick()


async def session(s: Session = Depends(_transaction, scope="function")) -> Session:
    return s  # async: handing the session over needs no trip to a worker thread


def _commit_in_worker(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """A sync endpoint that commits its session(s) before it returns, in its own worker
    thread. Otherwise the commit waits for the function-scoped dependency's exit, after
    FastAPI has validated the response, which takes a thread of its own: under load every
    worker thread could be waiting for the database's write lock that this transaction holds,
    and it could not get a thread to commit (seen: 100 concurrent submits, all timing out
    after 30 s). The dependency's own commit then has nothing left to do."""
    if inspect.iscoroutinefunction(inspect.unwrap(endpoint)):
        return endpoint

    @functools.wraps(endpoint)
    def call(*args: Any, **kwargs: Any) -> Any:
        result = endpoint(*args, **kwargs)
        for value in kwargs.values():
            if isinstance(value, Session) and value.in_transaction():
                value.commit()
        return result

    return call


class CommitRoute(APIRoute):
    """The route class of the API routers whose endpoints take ``Depends(session)``."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, _commit_in_worker(endpoint), **kwargs)
