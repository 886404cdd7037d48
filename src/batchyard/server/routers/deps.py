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
import typing
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.routing import APIRoute
from pydantic import AfterValidator
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from batchyard.server.auth import context, server_context
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

async def _transaction(ctx: ServerContext = Depends(context)) -> AsyncIterator[Session]:
    """One session per request, opened and closed on the event loop: a session connects
    only at its first statement, and one whose transaction has ended holds nothing, so
    neither needs a worker thread. Only a transaction still open at the end (an endpoint
    that raised before its commit, or one that does not commit itself) is committed or rolled
    back in a worker thread (that talks to the database)."""
    s = ctx.db.open_session()
    try:
        yield s
    except BaseException:
        if s.in_transaction():
            await run_in_threadpool(_end, s, False)
        else:
            s.close()
        raise
    if s.in_transaction():
        await run_in_threadpool(_end, s, True)
    else:
        s.close()
    if s.info.get("kick"):
        ctx.kick()


def _end(s: Session, commit: bool) -> None:
    """``Database.session``'s end: committed (or rolled back), then closed."""
    with s:
        if not commit:
            s.rollback()
            return
        try:
            s.commit()
        except BaseException:
            s.rollback()
            raise


async def session(s: Session = Depends(_transaction, scope="function")) -> Session:
    return s  # async: handing the session over needs no trip to a worker thread


def _commit_sessions(kwargs: dict[str, Any]) -> None:
    for value in kwargs.values():
        if isinstance(value, Session) and value.in_transaction():
            value.commit()


def _commit_in_worker(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """A sync endpoint that commits its session(s) before it returns, in its own worker
    thread. Otherwise the commit waits for the function-scoped dependency's exit, after
    FastAPI has validated the response, which takes a thread of its own: under load every
    worker thread could be waiting for the database's write lock that this transaction holds,
    and it could not get a thread to commit (seen: 100 concurrent submits, all timing out
    after 30 s). The dependency's own commit then has nothing left to do.

    The endpoint and its commit run as one call in the thread pool, from an async function:
    FastAPI then validates the answer on the event loop instead of in a second trip to a
    worker thread (each trip costs the loop a wake-up, a queue hand-over and the GIL back
    and forth: about as much as the rest of a small request). An endpoint that answers a
    list (a listing of any length) keeps FastAPI's own way: a long answer is validated in
    a worker thread, off the event loop.

    Such an endpoint's ``Depends(session)`` is not solved by FastAPI either: the session is
    opened, committed and closed around the endpoint in that same worker call. FastAPI's
    generator dependency (an exit stack, a cancel scope, a context manager per request) cost
    the event loop about a tenth of a submit's CPU."""
    if inspect.iscoroutinefunction(inspect.unwrap(endpoint)):
        return endpoint

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = endpoint(*args, **kwargs)
        _commit_sessions(kwargs)
        return result

    if typing.get_origin(_return_type(endpoint)) is list:

        @functools.wraps(endpoint)
        def call(*args: Any, **kwargs: Any) -> Any:
            return run(args, kwargs)

        return call

    signature = inspect.signature(endpoint)
    owned = [name for name, p in signature.parameters.items()
             if getattr(p.default, "dependency", None) is session]
    if not owned:

        @functools.wraps(endpoint)
        async def one_trip(*args: Any, **kwargs: Any) -> Any:
            return await run_in_threadpool(run, args, kwargs)

        return one_trip

    def run_owning(ctx: ServerContext, kwargs: dict[str, Any]) -> tuple[Any, bool]:
        sessions = [ctx.db.open_session() for _ in owned]
        try:
            kwargs.update(zip(owned, sessions, strict=True))
            result = endpoint(**kwargs)
            for s in sessions:
                if s.in_transaction():
                    s.commit()
        except BaseException:
            for s in sessions:
                s.rollback()
            raise
        finally:
            for s in sessions:
                s.close()
        _commit_sessions(kwargs)  # any other session it was given
        return result, any(s.info.get("kick") for s in sessions)

    @functools.wraps(endpoint)
    async def owning_trip(**kwargs: Any) -> Any:
        ctx = server_context(kwargs.pop(_REQUEST))
        result, kick = await run_in_threadpool(run_owning, ctx, kwargs)
        if kick:
            ctx.kick()
        return result

    params = [p for name, p in signature.parameters.items() if name not in owned]
    params.append(inspect.Parameter(_REQUEST, inspect.Parameter.KEYWORD_ONLY,
                                    annotation=Request))
    owning_trip.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=sorted(params, key=lambda p: p.kind))
    return owning_trip


_REQUEST = "_batchyard_request"


def _return_type(endpoint: Callable[..., Any]) -> Any:
    try:
        return inspect.signature(endpoint, eval_str=True).return_annotation
    except (NameError, TypeError):  # an annotation that names what its module never imports
        return None


class CommitRoute(APIRoute):
    """The route class of the API routers whose endpoints take ``Depends(session)``."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, _commit_in_worker(endpoint), **kwargs)
