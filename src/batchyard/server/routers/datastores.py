from __future__ import annotations

import os
import tempfile
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session

from batchyard.server.routers.deps import CommitRoute, session
from batchyard.server.routers.downloads import content_type, safe_headers
from batchyard.server.security.permissions import InWorkspace
from batchyard.server.security.principal import Role
from batchyard.server.services import datastores
from batchyard.server.services.datastores import DatastoreIn

router = APIRouter(tags=["datastores"], route_class=CommitRoute)
READ = InWorkspace(Role.reader)
STORE = "/workspaces/{ws}/datastores/{name}"


@router.post("/workspaces/{ws}/datastores", status_code=201, dependencies=[Depends(InWorkspace(
    Role.owner, "datastore.register", target=lambda p, b: b.get("name")))])
def register(ws: str, body: DatastoreIn, s: Session = Depends(session)) -> dict[str, Any]:
    return datastores.register(s, ws, body)


@router.get("/workspaces/{ws}/datastores", dependencies=[Depends(READ)])
def list_all(ws: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return datastores.list_all(s, ws)


@router.get(STORE, dependencies=[Depends(READ)])
def show(ws: str, name: str, s: Session = Depends(session)) -> dict[str, Any]:
    return datastores.show(s, ws, name)


@router.delete(STORE, status_code=204,
               dependencies=[Depends(InWorkspace(Role.owner, "datastore.delete"))])
def delete(ws: str, name: str, s: Session = Depends(session)) -> Response:
    datastores.delete(s, ws, name)
    return Response(status_code=204)


@router.get(STORE + "/files", dependencies=[Depends(READ)])
def files(ws: str, name: str, prefix: str = "",
          s: Session = Depends(session)) -> list[dict[str, Any]]:
    return datastores.files(s, ws, name, prefix)


@router.put(STORE + "/files/{path:path}",
            dependencies=[Depends(InWorkspace(Role.contributor, "datastore.upload"))])
async def put_file(ws: str, name: str, path: str, request: Request,
                   s: Session = Depends(session)) -> dict[str, Any]:
    fd, tmp = tempfile.mkstemp(prefix="batchyard-upload-")
    try:
        with os.fdopen(fd, "wb") as fh:
            async for chunk in request.stream():
                fh.write(chunk)
        result: dict[str, Any] = await run_in_threadpool(
            datastores.write_file, s, ws, name, path, tmp)
        return result
    finally:
        os.unlink(tmp)


@router.get(STORE + "/files/{path:path}", dependencies=[Depends(READ)])
def get_file(ws: str, name: str, path: str,
             s: Session = Depends(session)) -> StreamingResponse:
    filename = path.rstrip("/").rsplit("/", 1)[-1] or name
    return StreamingResponse(datastores.read_file(s, ws, name, path),
                             media_type=content_type(filename), headers=safe_headers(filename))
