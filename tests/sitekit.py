"""A batchyard server on one host of a HostNet (tests/hostkit.py), with the CLI and the API
run on that host (the test process cannot reach any host): what the multi-host tests share,
whatever runs the nodes (agents on machines, slurmds on a Slurm partition).

Also the checks they share: what a rank printed, what processes of an attempt are left on a
host (by pid, by process tag, by the launcher's argv)."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hostkit import Host, HostNet
from yardkit import pid_alive as _alive
from yardkit import wait_until

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
PY = sys.executable
TERMINAL = ("succeeded", "failed", "canceled")

# Runs inside the server host (the test process cannot reach any host): polls the API with
# the home's admin token and CA, so a wait costs one process start, not one per poll.
API_PY = r'''
import json, sys, time
import httpx
from batchyard.client.http import verify_for
from batchyard.config import read_server_info, read_token

url = read_server_info().url
http = httpx.Client(base_url=url + "/api/v1", timeout=30, verify=verify_for(url),
                    headers={"Authorization": "Bearer " + read_token()})
what, args = sys.argv[1], sys.argv[2:]
if what == "get":
    resp = http.get(args[0])
    print(json.dumps({"status": resp.status_code, "body": resp.json()}))
elif what == "wait-job":
    name, states, timeout = args[0], args[1].split(","), float(args[2])
    path = "/workspaces/default/experiments/default/jobs/" + name
    deadline = time.monotonic() + timeout
    while True:
        try:
            job = http.get(path).json()
        except (httpx.HTTPError, ValueError):
            job = {"state": "?"}
        if job.get("state") in states or time.monotonic() > deadline:
            print(json.dumps(job))
            break
        time.sleep(0.1)
elif what == "wait-nodes":
    cluster, count = args[0], int(args[1])
    states, timeout = args[2].split(","), float(args[3])
    deadline = time.monotonic() + timeout
    while True:
        try:
            nodes = http.get(f"/workspaces/default/clusters/{cluster}/nodes").json()
        except (httpx.HTTPError, ValueError):
            nodes = []
        if (len(nodes) == count and all(n["state"] in states for n in nodes)) \
                or time.monotonic() > deadline:
            print(json.dumps(nodes))
            break
        time.sleep(0.1)
'''



@dataclass
class Site:
    net: HostNet
    server: Host
    home: Path
    work: Path
    env: dict[str, str]
    url: str
    port: int
    cluster: str

    # --- the CLI and the API, on the server host ------------------------------------------

    def cli(self, *args: str, timeout: float = 60, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
        return self.server.run([PY, "-m", "batchyard.cli.main", *args], env=self.env,
                               timeout=timeout, cwd=cwd or self.work)

    def ok(self, *args: str, timeout: float = 60, cwd: Path | None = None) -> str:
        res = self.cli(*args, timeout=timeout, cwd=cwd)
        assert res.returncode == 0 and "Traceback" not in res.stderr, show(res)
        return res.stdout

    def js(self, *args: str, timeout: float = 60, cwd: Path | None = None) -> Any:
        return json.loads(self.ok(*args, "-o", "json", timeout=timeout, cwd=cwd))

    def api(self, *args: str, timeout: float = 60) -> Any:
        res = self.server.run([PY, "-c", API_PY, *args], env=self.env, timeout=timeout + 30,
                              cwd=self.work)
        assert res.returncode == 0, show(res)
        return json.loads(res.stdout)

    def job(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = self.api("get", f"/workspaces/default/experiments/default/"
                                        f"jobs/{name}")["body"]
        return data

    def wait_job(self, name: str, states: tuple[str, ...] = TERMINAL,
                 timeout: float = 60) -> dict[str, Any]:
        job: dict[str, Any] = self.api("wait-job", name, ",".join(states), str(timeout),
                                       timeout=timeout)
        assert job.get("state") in states, f"job {name} did not reach {states}: {job}\n" \
            + self.server_log_tail()
        return job

    def nodes(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self.js("cluster", "node", "list", "-c", self.cluster)
        return data

    def wait_nodes(self, count: int, states: tuple[str, ...] = ("idle",), timeout: float = 30
                   ) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = self.api("wait-nodes", self.cluster, str(count),
                                               ",".join(states), str(timeout), timeout=timeout)
        assert len(nodes) == count and all(n["state"] in states for n in nodes), nodes
        return nodes

    def submit(self, job_file: Path, name: str, cwd: Path | None = None) -> None:
        self.ok("job", "create", "-f", str(job_file), "-n", name, "-c", self.cluster,
                cwd=cwd or job_file.parent, timeout=120)

    def logs(self, name: str, *extra: str) -> str:
        return self.ok("job", "logs", "-n", name, *extra, timeout=60)

    def write_job(self, name: str, spec: dict[str, Any], files: dict[str, str] | None = None
                  ) -> Path:
        folder = self.work / "jobs" / name
        folder.mkdir(parents=True, exist_ok=True)
        for fname, text in (files or {}).items():
            (folder / fname).write_text(text)
        path = folder / "job.yaml"
        path.write_text(yaml.safe_dump({"name": name, **spec}, sort_keys=False))
        return path

    # --- processes ------------------------------------------------------------------------

    def start_server(self) -> None:
        env = {k: v for k, v in self.env.items() if k != "BATCHYARD_SERVER"}
        res = self.server.run([PY, "-m", "batchyard.cli.main", "server", "start", "--host",
                               self.server.addr, "--port", str(self.port), "-o", "json"],
                              env=env, timeout=90, cwd=self.work)
        assert res.returncode == 0, show(res)

    def server_pid(self) -> int:
        return int(json.loads((self.home / "server.json").read_text())["pid"])

    def server_log_tail(self, size: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return "\n--- server log ---\n" + (self.home / "server.log").read_text()[-size:]
        return ""


def show(res: subprocess.CompletedProcess[str]) -> str:
    argv = res.args[res.args.index("--") + 1:] if "--" in res.args else res.args
    return (f"{shlex.join(map(str, argv))} -> rc {res.returncode}\n--- stdout ---\n"
            f"{res.stdout[-4000:]}\n--- stderr ---\n{res.stderr[-4000:]}")


def environ_of(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def tagged_in(host: Host, attempt_uuid: str) -> list[int]:
    """Processes on ``host`` carrying the attempt's process tag (hosts share the pid ns)."""
    needle = f"BATCHYARD_PROC_TAG={attempt_uuid}/".encode()
    return [p for p in host.pids() if needle in environ_of(p) and _alive(p)]


def launcher_pids(host: Host, attempt_uuid: str) -> list[int]:
    """The node launchers of an attempt on ``host``: their argv names the attempt's ticket."""
    found = []
    for pid in host.pids():
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
            if attempt_uuid.encode() in cmdline and b"batchyard.node" in cmdline \
                    and _alive(pid):
                found.append(pid)
    return found


def example(site: Site, name: str) -> Path:
    """A copy of examples/NAME in the scratch dir (on the file system the hosts share)."""
    target = site.work / "examples" / name
    shutil.copytree(EXAMPLES / name, target,
                    ignore=shutil.ignore_patterns("outputs", "__pycache__", "*.pyc"))
    return target


def rank_lines(logs: str, rank: int) -> list[str]:
    """What `job logs` shows of one global rank (prefixed ``[node/rankN] `` or ``...:err] ``)."""
    prefix = re.compile(rf"^\[[\w.-]+/rank{rank}(:err)?\] ")
    return [prefix.sub("", line) for line in logs.splitlines() if prefix.match(line)]


def download(site: Site, name: str, path: str) -> Path:
    dest = site.work / "downloads" / name
    done = site.js("job", "file", "download", "-n", name, "-p", path, "-d", str(dest))
    assert done and all(d["size"] > 0 for d in done), done
    return dest


def assert_nothing_left(hosts: list[Host], job: dict[str, Any], timeout: float = 5) -> None:
    """No process of the job's last attempt on any of ``hosts``: not its launchers, not its
    ranks by the pids the launchers reported, not anything carrying its process tag."""
    uuid = job["attempts"][-1]["uuid"]
    pids = []
    for report in job["attempts"][-1].get("nodes") or []:
        pids += [int(report["pid"])] if report.get("pid") else []
        pids += [int(r["pid"]) for r in report.get("ranks", []) if r.get("pid")]
    assert len(pids) >= 2, job["attempts"][-1]

    def left() -> list[str]:
        return [f"{h.name}: pids {[p for p in pids if p in h.pids() and _alive(p)]}, "
                f"tagged {tagged_in(h, uuid)}, launchers {launcher_pids(h, uuid)}"
                for h in hosts if tagged_in(h, uuid) or launcher_pids(h, uuid)
                or [p for p in pids if p in h.pids() and _alive(p)]]

    with contextlib.suppress(AssertionError):
        wait_until(lambda: not left(), timeout, what="the job's processes to be gone")
    assert not left(), f"processes of job {job['name']} left: {left()}"

