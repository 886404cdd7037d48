"""A submitted job (``Run`` is the same thing under Azure ML's name): state, waiting with live
logs, metrics, tags, files, termination."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from batchyard.client.http import Client
from batchyard.sdk._client import default_client
from batchyard.sdk.metrics import decode, jsonable
from batchyard.states import JOB_TERMINAL

if TYPE_CHECKING:
    from batchyard.sdk.workspace import Workspace

TERMINAL = JOB_TERMINAL


class Job:
    """One job of an experiment. ``data`` is the server's view at the last refresh."""

    def __init__(self, workspace: Workspace | str, experiment: str, name: str, *,
                 data: dict[str, Any] | None = None, client: Client | None = None) -> None:
        from batchyard.sdk.workspace import Workspace

        self.workspace = workspace if isinstance(workspace, Workspace) else \
            Workspace(workspace, client=client)
        self.experiment = experiment
        self.name = name
        self.data: dict[str, Any] = data or {}

    @classmethod
    def get(cls, name: str, experiment: str = "default", workspace: str = "default", *,
            client: Client | None = None) -> Job:
        job = cls(workspace, experiment, name, client=client)
        job.refresh()
        return job

    def __repr__(self) -> str:
        state = self.data.get("state", "?")
        return f"Job({self.workspace.name}/{self.experiment}/{self.name}, {state})"

    @property
    def client(self) -> Client:
        return self.workspace.client

    @property
    def path(self) -> str:
        return Client.job_path(self.workspace.name, self.experiment, self.name)

    @property
    def portal_url(self) -> str:
        """The job's page in the web portal (it asks to sign in first when needed)."""
        return self.client.url + portal_path(self.workspace.name, self.experiment, self.name)

    # state -------------------------------------------------------------------------------------

    def refresh(self) -> dict[str, Any]:
        self.data = self.client.get(self.path)
        return self.data

    @property
    def state(self) -> str:
        return str(self.refresh()["state"])

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    @property
    def error(self) -> dict[str, Any] | None:
        """Why it failed: cause (``oom``, ``nccl/gloo timeout``, ``node lost``, ``preempted``,
        ``wall clock``, ``signal N``, ``user code error``, ``preparation failed``, ``image
        pull failed``), rank, node, exit_code and the failing rank's last error lines."""
        found = self.refresh().get("error")
        return dict(found) if found else None

    def wait(self, timeout: float | None = None, *, show_output: bool = False,
             out: TextIO | None = None, poll: float = 0.3) -> dict[str, Any]:
        """Block until the job ends (or ``timeout`` seconds pass); with ``show_output``, print
        every rank's log lines live while waiting. Returns the job's final view."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if show_output:
            self.stream_logs(out)
        while self.refresh()["state"] not in TERMINAL:
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(poll)
        return self.data

    def terminate(self) -> dict[str, Any]:
        self.data = self.client.post(self.path + "/terminate")
        return self.data

    def delete(self) -> None:
        self.client.delete(self.path)

    # logs ----------------------------------------------------------------------------------------

    def logs(self, *, follow: bool = False, node: str | None = None, rank: int | None = None,
             stream: str = "all", attempt: int | None = None) -> Iterator[str]:
        """The log lines (each ending in a newline, prefixed with ``[node/rankK]``) as they
        arrive; with ``follow``, until the job has ended::

            for line in job.logs(follow=True):
                print(line, end="")

        A follower reconnects when its stream breaks (a server restarting, a 502-504) and
        goes on after the last line it gave: each line comes once (client/follow.py)."""
        from batchyard.client.follow import follow_logs

        pending = b""
        chunks = follow_logs(self.client, self.path, node=node, rank=rank, stream=stream,
                             attempt=attempt) if follow else self.client.stream(
            self.path + "/logs", node=node, rank=rank, stream=stream, attempt=attempt)
        for chunk in chunks:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", errors="replace") + "\n"
        if pending:
            yield pending.decode("utf-8", errors="replace")

    def stream_logs(self, out: TextIO | None = None) -> None:
        """Print every rank's logs live until the job ends."""
        target = out or sys.stdout
        for text in self.logs(follow=True):
            target.write(text)
            target.flush()

    # metrics and tags ------------------------------------------------------------------------

    def metrics(self, name: str | None = None, *, after: int | None = None
                ) -> list[dict[str, Any]]:
        """Every value logged, in order: dicts with name, kind, value, step, rank, attempt, ts."""
        rows: list[dict[str, Any]] = self.client.get(self.path + "/metrics", metric=name,
                                                     after=after)
        for row in rows:
            row["value"] = decode(row["value"])
        return rows

    def metric_values(self, name: str) -> list[Any]:
        return [row["value"] for row in self.metrics(name)]

    def latest_metrics(self) -> dict[str, Any]:
        """Name -> the last value logged."""
        return {row["name"]: row["value"] for row in self.metrics()}

    def log_metric(self, name: str, value: Any, step: int | None = None,
                   kind: str = "scalar") -> None:
        """Record a value from outside the job (sent at once, not batched)."""
        self.client.post(self.path + "/metrics", {"metrics": [
            {"name": name, "value": jsonable(value), "kind": kind, "step": step}]})

    def tags(self) -> dict[str, str]:
        result: dict[str, str] = self.client.get(self.path + "/tags")
        return result

    def params(self) -> dict[str, str]:
        """The parameters the job logged (MLflow's ``log_param`` in its ranks)."""
        return dict(self.refresh().get("params") or {})

    def gpu_usage(self) -> list[dict[str, Any]]:
        """Each GPU's mean and 10th-percentile utilisation (the latest attempt with GPUs)."""
        return list(self.refresh().get("gpu_usage") or [])

    def set_tags(self, tags: dict[str, str | None]) -> dict[str, str]:
        """Merge tags (a None value removes one)."""
        result: dict[str, str] = self.client.post(self.path + "/tags", {"tags": tags})
        return result

    # files -------------------------------------------------------------------------------------

    def files(self, attempt: int | None = None) -> list[dict[str, Any]]:
        """Logs (``stdouterr/…``) and outputs (``outputs/<ID>/…``) of an attempt."""
        listing = self.client.get(self.path + "/files", attempt=attempt)
        files: list[dict[str, Any]] = listing["files"]
        return files

    def download(self, path: str, dest: str | Path = ".", attempt: int | None = None) -> Path:
        """Download one file; ``dest`` is a file path, or a directory to put it in."""
        target = Path(dest)
        if target.is_dir() or str(dest).endswith(("/", "\\")):
            target = target / Path(path).name
        target.parent.mkdir(parents=True, exist_ok=True)
        self.client.download(self.path + "/files/content", str(target), path=path,
                             attempt=attempt)
        return target

    def download_all(self, dest: str | Path = ".", prefix: str | None = None,
                     attempt: int | None = None) -> list[Path]:
        """Download every file (under ``prefix``), keeping its path below ``dest``."""
        saved = []
        for entry in self.files(attempt):
            path = str(entry["path"])
            if prefix and not (path == prefix or path.startswith(prefix.rstrip("/") + "/")):
                continue
            target = Path(dest) / path
            target.parent.mkdir(parents=True, exist_ok=True)
            self.client.download(self.path + "/files/content", str(target), path=path,
                                 attempt=attempt)
            saved.append(target)
        return saved


def portal_path(workspace: str, experiment: str, name: str) -> str:
    """Where the portal shows a job (``/ws/WS/exp/EXP/jobs/NAME``)."""
    from urllib.parse import quote

    return "/ws/{}/exp/{}/jobs/{}".format(*(quote(part, safe="")
                                            for part in (workspace, experiment, name)))


Run = Job

__all__ = ["TERMINAL", "Job", "Run", "default_client", "portal_path"]
