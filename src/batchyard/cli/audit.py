"""`batchyard audit list`."""

from __future__ import annotations

from typing import Any

import typer

from batchyard.cli import groups
from batchyard.cli.common import Output, OutputOpt, client, emit, handled, path_safe, table

audit_app = groups.audit
COLUMNS = [("when", "When"), ("actor", "Who"), ("action", "What"), ("target", "Target", "text"),
           ("workspace", "Workspace", "id?"), ("client", "From", "id?"),
           ("outcome", "Outcome"), ("credential", "Credential", "id?"),
           ("detail", "Detail", "text?")]


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import time

    return [{**r, "when": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["ts"]))}
            for r in rows]


@audit_app.command("list")
def audit_list(user: str = typer.Option(None, "--user", "-u", help="Only what this user did."),
               since: str = typer.Option(None, "--since", help="Only entries since then: a "
                                         "duration back from now (1d, 2h, 90m) or a date "
                                         "(2025-01-31, 2025-01-31T08:00)."),
               workspace: str = typer.Option(None, "--workspace", "-w", callback=path_safe,
                                             help="Only this workspace's entries (its owners "
                                             "may list these; without -w: admins only)."),
               action: str = typer.Option(None, "--action", help="Only this action, e.g. "
                                          "job.submit, or job.* ."),
               limit: int = typer.Option(1000, "--limit", help="The newest N entries."),
               output: Output = OutputOpt) -> None:
    """List the audit trail, oldest first: every change, sign-in, failed authentication and
    refused call, with who, what, the target, when, from where and the outcome."""
    with handled():
        params = {"user": user, "since": since, "action": action, "limit": limit}
        path = f"/workspaces/{workspace}/audit" if workspace else "/audit"
        rows = client().get(path, **params)
        emit(rows, output, lambda d: table(_rows(d), COLUMNS, empty="no audit entries"))
