from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from batchyard import __version__
from batchyard.errors import NotFound, SpecError
from batchyard.server.auth import Principal, context
from batchyard.server.context import ServerContext
from batchyard.server.security.permissions import Public, SignedIn
from batchyard.spec.job import json_schema

router = APIRouter(tags=["system"])
SIGNED_IN = SignedIn()
MAX_SNAPSHOT = 512 * 1024 * 1024


@router.get("/health")
async def health(_: Principal = Depends(SIGNED_IN)) -> dict[str, Any]:
    """Async: it waits on nothing, and a sync route costs two trips to a worker thread."""
    return {"status": "ok", "version": __version__, "pid": os.getpid()}


@router.get("/ca.pem", response_class=Response,
            responses={200: {"content": {"application/x-pem-file": {}}}})
def ca_pem(ctx: ServerContext = Depends(context),
           _: None = Depends(Public("a client pins the CA before it trusts the server"))
           ) -> Response:
    """The server's own CA certificate, unauthenticated on purpose: a client pins its sha256
    (BATCHYARD_CA_SHA256) before it may trust it, and it is public anyway. Never a key."""
    if not ctx.tls_ca:
        raise NotFound("this server has no CA of its own to offer (it serves plain HTTP, or "
                       "a certificate it was given: ask its admin for the CA)")
    return Response(Path(ctx.tls_ca).read_bytes(), media_type="application/x-pem-file")


@router.get("/schema/job")
def job_schema(_: Principal = Depends(SIGNED_IN)) -> dict[str, Any]:
    return json_schema()


@router.post("/snapshots")
async def upload_snapshot(request: Request,
                          _: Principal = Depends(SignedIn("snapshot.upload")),
                          ctx: ServerContext = Depends(context)) -> dict[str, Any]:
    """Content-addressed code snapshot (a .tar.gz); returns its id for `code: snapshot:<id>`."""
    sha = hashlib.sha256()
    size = 0
    tmp = ctx.snapshots / f".upload-{os.getpid()}-{id(request)}"
    with open(tmp, "wb") as fh:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_SNAPSHOT:
                fh.close()
                tmp.unlink(missing_ok=True)
                raise SpecError(f"code: snapshot larger than {MAX_SNAPSHOT // 2**20} MiB")
            sha.update(chunk)
            fh.write(chunk)
    digest = sha.hexdigest()
    os.replace(tmp, ctx.snapshots / f"{digest}.tar.gz")
    return {"id": digest, "size": size}
