from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from batchyard.server.auth import require_admin
from batchyard.server.routers.deps import CommitRoute, session
from batchyard.server.services import clusters
from batchyard.spec.cluster import ClusterSpec

router = APIRouter(tags=["clusters"], dependencies=[Depends(require_admin)],
                   route_class=CommitRoute)


class ResizeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: int = Field(ge=0, le=10000)


class AutoScaleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_nodes: int = Field(ge=0, le=10000)
    max_nodes: int = Field(ge=1, le=10000)
    idle_seconds_before_scaledown: float | None = Field(None, ge=0)


class ExecIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    argv: list[str] = Field(min_length=1)
    timeout: float = Field(60.0, gt=0, le=3600)


@router.post("/workspaces/{ws}/clusters", status_code=201)
def create(ws: str, spec: ClusterSpec, s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.create(s, ws, spec)


@router.get("/workspaces/{ws}/clusters")
def list_all(ws: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return clusters.list_all(s, ws)


@router.get("/workspaces/{ws}/clusters/{name}")
def show(ws: str, name: str, s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.show(s, ws, name)


@router.post("/workspaces/{ws}/clusters/{name}/resize")
def resize(ws: str, name: str, body: ResizeIn, s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.resize(s, ws, name, body.target)


@router.delete("/workspaces/{ws}/clusters/{name}", status_code=204)
def delete(ws: str, name: str, s: Session = Depends(session)) -> Response:
    clusters.delete(s, ws, name)
    return Response(status_code=204)


@router.get("/workspaces/{ws}/clusters/{name}/nodes")
def nodes(ws: str, name: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return clusters.nodes(s, ws, name)


@router.post("/workspaces/{ws}/clusters/{name}/nodes/{node}/exec")
def exec_on_node(ws: str, name: str, node: str, body: ExecIn,
                 s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.exec_on_node(s, ws, name, node, body.argv, body.timeout)


@router.post("/workspaces/{ws}/clusters/{name}/autoscale")
def auto_scale(ws: str, name: str, body: AutoScaleIn,
               s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.auto_scale(s, ws, name, body.min_nodes, body.max_nodes,
                               body.idle_seconds_before_scaledown)


@router.post("/workspaces/{ws}/clusters/{name}/nodes/{node}/preempt")
def preempt(ws: str, name: str, node: str, s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.preempt_node(s, ws, name, node)


@router.get("/workspaces/{ws}/clusters/{name}/files")
def files(ws: str, name: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return clusters.setup_files(s, ws, name)


@router.get("/workspaces/{ws}/clusters/{name}/files/content")
def file_content(ws: str, name: str, path: str, s: Session = Depends(session)) -> Response:
    content = clusters.setup_file(s, ws, name, path)
    filename = path.rsplit("/", 1)[-1]
    return Response(content, media_type="application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="{filename}"'})
