from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.orm import Session

from batchyard.errors import SpecError
from batchyard.server.routers.deps import CommitRoute, session
from batchyard.server.routers.downloads import bytes_response
from batchyard.server.security.permissions import Admin, InWorkspace
from batchyard.server.security.principal import Role
from batchyard.server.services import clusters
from batchyard.spec.cluster import ClusterSpec

router = APIRouter(tags=["clusters"], route_class=CommitRoute)
READ = InWorkspace(Role.reader)
CLUSTER = "/workspaces/{ws}/clusters/{name}"


def root_jobs(body: dict[str, Any]) -> str | None:
    """A cluster whose jobs may run as root on its hosts is the server admin's call."""
    if body.get("allow_root_jobs"):
        return "allow_root_jobs (a cluster whose jobs may run as root)"
    return None


def manage(action: str) -> InWorkspace:
    return InWorkspace(Role.owner, action)


class ResizeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: int = Field(ge=0, le=10000)


class AutoScaleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_nodes: int = Field(ge=0, le=10000)
    max_nodes: int = Field(ge=1, le=10000)
    idle_seconds_before_scaledown: float | None = Field(None, ge=0, le=10 * 365 * 86400,
                                                        allow_inf_nan=False)


class ExecIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    argv: list[str] = Field(min_length=1, max_length=4096)
    timeout: float = Field(60.0, gt=0, le=3600, allow_inf_nan=False)

    @field_validator("argv")
    @classmethod
    def _argv(cls, argv: list[str]) -> list[str]:
        if not argv[0]:
            raise ValueError("argv[0]: the program to run is empty")
        for index, arg in enumerate(argv):
            if "\x00" in arg:
                raise ValueError(f"argv[{index}]: must not contain a NUL byte")
        return argv


@router.post("/workspaces/{ws}/clusters", status_code=201, dependencies=[Depends(InWorkspace(
    Role.owner, "cluster.create", admin_if=root_jobs, target=lambda p, b: b.get("name")))])
def create(ws: str, spec: ClusterSpec, s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.create(s, ws, spec)


@router.get("/workspaces/{ws}/clusters", dependencies=[Depends(READ)])
def list_all(ws: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return clusters.list_all(s, ws)


@router.get(CLUSTER, dependencies=[Depends(READ)])
def show(ws: str, name: str, s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.show(s, ws, name)


@router.post(CLUSTER + "/resize", dependencies=[Depends(manage("cluster.resize"))])
def resize(ws: str, name: str, body: ResizeIn, s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.resize(s, ws, name, body.target)


@router.delete(CLUSTER, status_code=204, dependencies=[Depends(manage("cluster.delete"))])
def delete(ws: str, name: str, s: Session = Depends(session)) -> Response:
    clusters.delete(s, ws, name)
    return Response(status_code=204)


@router.get(CLUSTER + "/nodes", dependencies=[Depends(READ)])
def nodes(ws: str, name: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return clusters.nodes(s, ws, name)


@router.post(CLUSTER + "/nodes/{node}/exec", dependencies=[Depends(Admin("cluster.node.exec"))])
def exec_on_node(ws: str, name: str, node: str, body: ExecIn,
                 s: Session = Depends(session)) -> dict[str, Any]:
    try:
        return clusters.exec_on_node(s, ws, name, node, body.argv, body.timeout)
    except (PermissionError, IsADirectoryError, NotADirectoryError) as exc:
        # e.g. a directory or a file without x as argv[0]: what was asked cannot run
        raise SpecError(f"argv[0]: cannot run {body.argv[0]!r} on node {node!r}: "
                        f"{exc.strerror or exc}") from None


@router.post(CLUSTER + "/autoscale", dependencies=[Depends(manage("cluster.autoscale"))])
def auto_scale(ws: str, name: str, body: AutoScaleIn,
               s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.auto_scale(s, ws, name, body.min_nodes, body.max_nodes,
                               body.idle_seconds_before_scaledown)


@router.post(CLUSTER + "/nodes/{node}/preempt",
             dependencies=[Depends(manage("cluster.node.preempt"))])
def preempt(ws: str, name: str, node: str, s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.preempt_node(s, ws, name, node)


@router.post(CLUSTER + "/nodes/{node}/enable",
             dependencies=[Depends(manage("cluster.node.enable"))])
def enable(ws: str, name: str, node: str, s: Session = Depends(session)) -> dict[str, Any]:
    return clusters.enable_node(s, ws, name, node)


@router.get(CLUSTER + "/files", dependencies=[Depends(READ)])
def files(ws: str, name: str, s: Session = Depends(session)) -> list[dict[str, Any]]:
    return clusters.setup_files(s, ws, name)


@router.get(CLUSTER + "/files/content", dependencies=[Depends(READ)])
def file_content(ws: str, name: str, path: str, s: Session = Depends(session)) -> Response:
    content = clusters.setup_file(s, ws, name, path)
    return bytes_response(content, path.rsplit("/", 1)[-1])
