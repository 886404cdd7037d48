"""Shell completion of names: clusters, jobs, experiments, workspaces, datastores and sweeps
are read from the running server (the one this home or $BATCHYARD_SERVER names, asked with a
short timeout); VM sizes come from the size table. Completion never starts a server, and a
server that is down, slow or refusing gives no names, never an error or a traceback: the
shell just offers nothing. Each function is a Typer ``autocompletion`` callback; this module
imports nothing heavy until one runs (start-up)."""

from __future__ import annotations

import os
from typing import Any

import typer

TIMEOUT = 1.5  # seconds: a shell's tab must not hang on a slow server
LIMIT = 500  # the newest jobs offered


def _fetch(path: str, **params: Any) -> list[dict[str, Any]]:
    """The list at ``path`` on the running server, or nothing."""
    try:
        from batchyard.client.http import Client
        from batchyard.config import read_server_info, read_token

        info = read_server_info()
        if info is None:  # no server was ever started here: none is started now
            return []
        client = Client(info.url, read_token(), timeout=TIMEOUT)
        try:
            rows = client.get(path, **params)
        finally:
            client.close()
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    except Exception:  # completion prints nothing on any failure
        return []


def _param(ctx: typer.Context, name: str) -> str | None:
    """An option already on the command line (``-w ws`` before the word being completed)."""
    value = (ctx.params or {}).get(name) if ctx is not None else None
    return value if isinstance(value, str) and value else None


def _workspace(ctx: typer.Context) -> str:
    return _param(ctx, "workspace") or os.environ.get("BATCHYARD_WORKSPACE") or "default"


def _names(rows: list[dict[str, Any]], incomplete: str) -> list[str]:
    found = [str(r["name"]) for r in rows if r.get("name")]
    return sorted({n for n in found if n.startswith(incomplete)})


def workspaces(ctx: typer.Context, incomplete: str) -> list[str]:
    return _names(_fetch("/workspaces"), incomplete)


def clusters(ctx: typer.Context, incomplete: str) -> list[str]:
    return _names(_fetch(f"/workspaces/{_workspace(ctx)}/clusters"), incomplete)


def experiments(ctx: typer.Context, incomplete: str) -> list[str]:
    return _names(_fetch(f"/workspaces/{_workspace(ctx)}/experiments"), incomplete)


def datastores(ctx: typer.Context, incomplete: str) -> list[str]:
    return _names(_fetch(f"/workspaces/{_workspace(ctx)}/datastores"), incomplete)


def sweeps(ctx: typer.Context, incomplete: str) -> list[str]:
    return _names(_fetch(f"/workspaces/{_workspace(ctx)}/sweeps",
                         experiment=_param(ctx, "experiment")), incomplete)


def jobs(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """The newest jobs (of -e's experiment when given), each with its state and experiment
    as the help zsh and fish show beside it."""
    rows = _fetch(f"/workspaces/{_workspace(ctx)}/jobs", experiment=_param(ctx, "experiment"),
                  limit=LIMIT)
    seen: dict[str, str] = {}
    for row in rows:
        name = str(row.get("name") or "")
        if name and name.startswith(incomplete) and name not in seen:
            seen[name] = f"{row.get('state')}, experiment {row.get('experiment')}"
    return sorted(seen.items())


def sizes(ctx: typer.Context, incomplete: str) -> list[tuple[str, str]]:
    """Node sizes, as the size table knows them (case as Azure writes them; what is typed
    matches whatever its case)."""
    from batchyard.spec.sizes import CATALOG

    out = []
    for size in CATALOG.values():
        if size.name.lower().startswith(incomplete.lower()):
            gpus = f", {size.gpus} GPU ({size.gpu_model})" if size.gpus else ""
            out.append((incomplete + size.name[len(incomplete):] if incomplete else size.name,
                        f"{size.vcpus} vCPU{gpus}, {size.memory_gb:g} GB"))
    return sorted(out)
