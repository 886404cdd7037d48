"""Helpers of the integration and e2e tests (fixtures in conftest.py): one isolated batchyard
installation (`Yard`: home dir, real server, the CLI as a subprocess, API polling) and
process checks (/proc scans for a job's process tag, pid liveness). No mocks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

TERMINAL = ("succeeded", "failed", "canceled")
CLUSTER = "local2"


@dataclass
class Result:
    """What one CLI call did."""

    args: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def __str__(self) -> str:  # shown by assertion messages
        return (f"batchyard {' '.join(self.args)} -> rc {self.rc}\n--- stdout ---\n"
                f"{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}")


# --- processes --------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] not in (b"Z", b"X")


def host_pid(record: str) -> int | None:
    """The pid a job process recorded of itself (``"PID NS"``: its pid and the inode of its
    PID namespace, as ``stat -Lc %i /proc/self/ns/pid`` gives it) as this host sees it;
    None when no process has that pid in that namespace any more (a job process runs in a
    PID namespace of its attempt's own: node/pidns.py)."""
    pid, _, ns = record.strip().partition(" ")
    if not ns or int(ns) == os.stat("/proc/self/ns/pid").st_ino:
        return int(pid)
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{entry}/ns/pid").st_ino != int(ns):
                continue
            with open(f"/proc/{entry}/status") as fh:
                nspid = next(line for line in fh if line.startswith("NSpid:")).split()
        except (OSError, StopIteration):
            continue
        if nspid[-1] == pid:
            return int(entry)
    return None


def _proc_blobs(pid: int) -> bytes:
    out = b""
    for name in ("cmdline", "environ"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/{name}", "rb") as fh:
            out += fh.read() + b"\0"
    with contextlib.suppress(OSError):  # launchers forked by the zygote: their cwd
        out += os.readlink(f"/proc/{pid}/cwd").encode() + b"\0"
    return out


def pids_where(match: Callable[[bytes], bool]) -> list[int]:
    """Live processes (not this one) whose cmdline+environ satisfy ``match``."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if match(_proc_blobs(pid)) and pid_alive(pid):
            found.append(pid)
    return found


def tagged_pids(attempt_uuid: str) -> list[int]:
    """Processes whose environment carries ``BATCHYARD_PROC_TAG=<attempt uuid>/<node>``."""
    needle = f"BATCHYARD_PROC_TAG={attempt_uuid}/".encode()
    return pids_where(lambda blob: needle in blob)


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05,
               what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


# --- the yard: one home, one server, the CLI ---------------------------------------------------


def cli_env(home: Path) -> dict[str, str]:
    """The environment a test runs batchyard's CLI and servers in: this machine's, without
    any batchyard, Batch AI or AML variable of the session's, on ``home``, with plain output."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BATCHYARD_", "AZ_BATCHAI_", "AZ_BATCH_", "AZUREML_"))}
    env.update({"BATCHYARD_HOME": str(home), "NO_COLOR": "1", "TERM": "dumb",
                "COLUMNS": "250", "PYTHONUNBUFFERED": "1"})
    return env


class Yard:
    """One isolated batchyard installation: home dir, server, CLI and API helpers."""

    def __init__(self, home: Path, work: Path) -> None:
        self.home = home
        self.work = work  # scratch space for job files and downloads
        env = cli_env(home)
        # the machine's GPU claims (node/gpuclaims.py) are this yard's own: a yard of an earlier
        # test whose virtual node still holds the fake GPUs takes none from the next
        env["BATCHYARD_GPU_CLAIMS"] = str(home / "gpu-claims")
        import pgkit

        if pgkit.ACTIVE is not None:  # BATCHYARD_TEST_DB=postgresql: a database per home
            env["BATCHYARD_DB_URL"] = pgkit.ACTIVE.create_database()
        self.env = env
        self._http: httpx.Client | None = None

    # CLI --------------------------------------------------------------------------------------

    def cli(self, *args: str, timeout: float = 120, cwd: Path | None = None,
            env: dict[str, str] | None = None, stdin: str | None = None) -> Result:
        """Run ``batchyard ARGS`` as a subprocess with this yard's environment (and ``env``
        on top: e.g. another user's BATCHYARD_TOKEN)."""
        proc = subprocess.run([sys.executable, "-m", "batchyard.cli.main", *args],
                              env={**self.env, **(env or {})}, cwd=str(cwd or self.work),
                              capture_output=True, text=True, timeout=timeout,
                              input=stdin, stdin=None if stdin is not None
                              else subprocess.DEVNULL)
        return Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)

    def ok(self, *args: str, timeout: float = 120) -> Result:
        """Run the CLI and insist on exit code 0."""
        result = self.cli(*args, timeout=timeout)
        assert result.rc == 0, str(result)
        assert "Traceback" not in result.stderr, str(result)
        return result

    def js(self, *args: str, timeout: float = 120) -> Any:
        """Run the CLI with ``--output json`` and parse what it printed."""
        return self.ok(*args, "--output", "json", timeout=timeout).json()

    # server -----------------------------------------------------------------------------------

    def start_server(self, port: int = 0, *flags: str) -> dict[str, Any]:
        """Start the server (on any free port unless told: a restart must come back on the
        port the node launchers know, like a server on its fixed port would), with
        ``flags`` of `server start` (e.g. single sign-on's)."""
        info = self.js("server", "start", "--port", str(port), *flags)
        self._reset_http()
        return info

    def server_info(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.home / "server.json").read_text())
        return data

    @property
    def url(self) -> str:
        return str(self.server_info()["url"])

    @property
    def server_pid(self) -> int:
        return int(self.server_info()["pid"])

    @property
    def token(self) -> str:
        return (self.home / "token").read_text().strip()

    def _reset_http(self) -> None:
        if self._http is not None:
            self._http.close()
        self._http = None

    @property
    def http(self) -> httpx.Client:
        """An authenticated client for the current server (for fast polling)."""
        if self._http is None:
            self._http = httpx.Client(base_url=self.url + "/api/v1", timeout=30,
                                      headers={"Authorization": f"Bearer {self.token}"})
        return self._http

    def stop(self) -> None:
        """Stop the server and kill every process left that refers to this home."""
        self._reset_http()
        with contextlib.suppress(Exception):
            self.cli("server", "stop", timeout=60)
        home = str(self.home).encode()
        _kill_all(pids_where(lambda blob: home in blob))

    # jobs -------------------------------------------------------------------------------------

    def write_job(self, name: str, spec: dict[str, Any] | str,
                  files: dict[str, str] | None = None) -> Path:
        """A job folder under the scratch dir: ``job.yaml`` (+ code files); returns the yaml."""
        folder = self.work / "jobs" / name
        folder.mkdir(parents=True, exist_ok=True)
        for fname, text in (files or {}).items():
            (folder / fname).write_text(textwrap.dedent(text))
        path = folder / "job.yaml"
        text = spec if isinstance(spec, str) else yaml.safe_dump(spec, sort_keys=False)
        path.write_text(text)
        return path

    def exchange(self, name: str) -> tuple[Path, dict[str, Any]]:
        """A folder this test and a job both write in, and the local mount that gives it to
        the job (at the same path): a job writes nowhere but its own folders and mounts, as
        an unprivileged uid (issue 32), so the folder is open to every uid."""
        folder = self.work / name
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)
        return folder, {"kind": "local", "relative_path": name, "source": str(folder)}

    def job(self, name: str, experiment: str = "default", workspace: str = "default"
            ) -> dict[str, Any]:
        resp = self.http.get(f"/workspaces/{workspace}/experiments/{experiment}/jobs/{name}")
        assert resp.status_code == 200, resp.text
        data: dict[str, Any] = resp.json()
        return data

    def wait_job(self, name: str, states: tuple[str, ...] = TERMINAL, timeout: float = 60,
                 experiment: str = "default", workspace: str = "default") -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.update(self.job(name, experiment, workspace))
            return found["state"] in states

        wait_until(reached, timeout, 0.05, f"job {name} to reach {states}")
        return found

    def cluster(self, name: str, workspace: str = "default") -> dict[str, Any]:
        resp = self.http.get(f"/workspaces/{workspace}/clusters/{name}")
        assert resp.status_code == 200, resp.text
        data: dict[str, Any] = resp.json()
        return data

    def wait_cluster(self, name: str, idle: int, workspace: str = "default",
                     timeout: float = 30) -> dict[str, Any]:
        """Until the cluster has exactly ``idle`` nodes, all idle (resizing is asynchronous)."""
        found: dict[str, Any] = {}

        def settled() -> bool:
            found.update(self.cluster(name, workspace))
            return (found["current_nodes"] == idle and found["node_counts"]["idle"] == idle
                    and found["allocation_state"] == "steady")

        wait_until(settled, timeout, 0.1, f"cluster {name} to have {idle} idle nodes")
        return found

    def attempt_dir(self, job: dict[str, Any], number: int | None = None) -> Path:
        """The server's attempt dir: its copies of the logs (stdouterr/, as the node channel
        delivered them) and of the outputs without a datastore (outputs/<ID>/)."""
        attempt = self._attempt(job, number)
        return (self.home / "workspaces" / job["workspace"] / "experiments" / job["experiment"]
                / "jobs" / job["name"] / attempt["uuid"])

    @staticmethod
    def _attempt(job: dict[str, Any], number: int | None = None) -> dict[str, Any]:
        attempts = job["attempts"]
        found: dict[str, Any] = attempts[-1] if number is None else attempts[number - 1]
        return found

    def node_dir(self, job: dict[str, Any], node: str) -> Path:
        """A virtual node's own directory (the local backend's layout)."""
        cluster = str(job["cluster"])
        return self.home / "clusters" / job["workspace"] / cluster / "nodes" / node

    def node_attempt_dirs(self, job: dict[str, Any], number: int | None = None) -> list[Path]:
        """Each node's own attempt dir, in node rank order: where its launcher and ranks
        work (shared/, checkpoints next to it, outputs before upload). The server never
        reads these; a test may, as the nodes' operator would."""
        attempt = self._attempt(job, number)
        nodes = attempt.get("nodes") or []
        assert nodes and all(n.get("node") for n in nodes), f"no node reports yet: {attempt}"
        return [self.node_dir(job, n["node"]) / "workspaces" / job["workspace"] / "experiments"
                / job["experiment"] / "jobs" / job["name"] / attempt["uuid"] for n in nodes]

    def node_reports(self, job: dict[str, Any], number: int | None = None
                     ) -> list[dict[str, Any]]:
        """What each node launcher last reported over the node channel, as the API shows."""
        nodes: list[dict[str, Any]] = self._attempt(job, number).get("nodes") or []
        return nodes

    def recorded_pids(self, job: dict[str, Any]) -> list[int]:
        """Launcher and rank pids of the job's last attempt, as its launchers reported them
        to the server (the API's per-node reports)."""
        pids = []
        for report in self.node_reports(job):
            if report.get("pid"):
                pids.append(int(report["pid"]))
            pids += [int(r["pid"]) for r in report.get("ranks", []) if r.get("pid")]
        return pids

    def assert_no_process_left(self, job: dict[str, Any], extra_pids: Sequence[int] = (),
                               timeout: float = 3.0) -> None:
        """Nothing of the job's last attempt is alive: not by recorded pid, not by the tag.
        (A short wait lets the launcher itself exit after writing its final status.)"""
        job = self.job(job["name"], job["experiment"], job["workspace"])  # the final reports
        uuid = job["attempts"][-1]["uuid"]
        pids = self.recorded_pids(job) + list(extra_pids)
        assert len(pids) >= 2, f"no recorded pids in the node reports of {job['name']}"

        def gone() -> bool:
            return not [p for p in pids if pid_alive(p)] and not tagged_pids(uuid)

        try:
            wait_until(gone, timeout, what="the job's processes to be gone")
        except AssertionError:
            left = [p for p in pids if pid_alive(p)]
            tagged = tagged_pids(uuid)
            _kill_all(left + tagged)
            raise AssertionError(f"processes of job {job['name']} still alive: by pid "
                                 f"{left}, by tag {tagged}") from None
