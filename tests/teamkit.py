"""A team on one real server (issue 32): two workspaces, each with a one-node local cluster,
and the callers of the route-by-caller test, each with a personal token made through the
CLI as an admin would (`user create`, `token create --user`, `role assign`).

    admin          the home's token (the server's OS user, an admin)
    owner          owner of workspace A        contributor   contributor of A
    reader         reader of A                 norole        a user with no role at all
    other_owner    owner of workspace B (and nothing in A)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from yardkit import Result, Yard, wait_until

WS_A, WS_B = "team-a", "team-b"
CLUSTER_A, CLUSTER_B = "ca", "cb"
USERS = {"owner": (WS_A, "owner"), "contributor": (WS_A, "contributor"),
         "reader": (WS_A, "reader"), "norole": None, "other_owner": (WS_B, "owner")}


@dataclass
class Team:
    yard: Yard
    tokens: dict[str, str] = field(default_factory=dict)  # caller -> token

    def token(self, who: str) -> str:
        return self.yard.token if who == "admin" else self.tokens[who]

    def cli(self, who: str, *args: str, **kw: Any) -> Result:
        """The CLI as ``who`` (BATCHYARD_TOKEN)."""
        return self.yard.cli(*args, env={"BATCHYARD_TOKEN": self.token(who)}, **kw)

    def ok(self, who: str, *args: str) -> Result:
        result = self.cli(who, *args)
        assert result.rc == 0, str(result)
        return result

    def api(self, who: str | None, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request on a fresh connection, as ``who`` (None: no token)."""
        headers = dict(kw.pop("headers", {}))
        if who is not None:
            headers["Authorization"] = f"Bearer {self.token(who)}"
        return httpx.request(method, self.yard.url + "/api/v1" + path, headers=headers,
                             timeout=30, **kw)

    def job_file(self, name: str, command: str = "sleep 600") -> str:
        return str(self.yard.write_job(name, {"name": name, "nodes": 1,
                                              "distribution": {"type": "custom"},
                                              "command": command}))

    def submit(self, who: str, name: str, ws: str = WS_A, command: str = "sleep 600",
               cluster: str = CLUSTER_A) -> Result:
        return self.ok(who, "job", "create", "-f", self.job_file(name, command), "-w", ws,
                       "-c", cluster)

    def wait_job(self, name: str, states: tuple[str, ...], ws: str = WS_A,
                 timeout: float = 90) -> dict[str, Any]:
        return self.yard.wait_job(name, states, timeout=timeout, workspace=ws)


def make_team(yard: Yard) -> Team:
    team = Team(yard)
    for ws, cluster in ((WS_A, CLUSTER_A), (WS_B, CLUSTER_B)):
        yard.ok("workspace", "create", ws)
        yard.ok("cluster", "create", "-n", cluster, "-w", ws, "-s", "Standard_D2_v2", "-t", "1")
    for name, role in USERS.items():
        yard.ok("user", "create", name, "--email", f"{name}@example.org")
        made = yard.js("token", "create", "--user", name, "--name", "tests")
        team.tokens[name] = made["token"]
        if role is not None:
            yard.ok("role", "assign", "-w", role[0], "--user", name, "--role", role[1])
    for ws, cluster in ((WS_A, CLUSTER_A), (WS_B, CLUSTER_B)):
        yard.wait_cluster(cluster, 1, workspace=ws)
    return team


def job_token(team: Team, name: str, ws: str = WS_A) -> str:
    """The job token of a running job whose command printed it first (``echo T=…``)."""
    path = f"/workspaces/{ws}/experiments/default/jobs/{name}/logs"

    def printed() -> str | None:
        text = team.api("admin", "GET", path).text
        return text.split("T=", 1)[1].split()[0] if "T=job." in text else None

    found: str = wait_until(printed, 60, 0.2, f"job {name}'s token in its log")
    return found
