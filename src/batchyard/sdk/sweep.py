"""A hyperparameter sweep from Python: create one from a spec (or a sweep file), follow it,
read its trials (each a :class:`~batchyard.sdk.job.Job`) and the best one.

    sweep = batchyard.Sweep.create("examples/sweep-ddp/sweep.yaml", cluster="local2")
    sweep.wait()
    print(sweep.best_trial().latest_metrics())
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from batchyard.sdk.job import Job

if TYPE_CHECKING:
    from batchyard.client.http import Client
    from batchyard.sdk.workspace import Workspace
    from batchyard.spec.sweep import SweepSpec

TERMINAL = ("succeeded", "failed", "canceled")


class Sweep:
    def __init__(self, workspace: Workspace | str, experiment: str, name: str, *,
                 data: dict[str, Any] | None = None, client: Client | None = None) -> None:
        from batchyard.sdk.workspace import Workspace

        self.workspace = workspace if isinstance(workspace, Workspace) else \
            Workspace(workspace, client=client)
        self.experiment = experiment
        self.name = name
        self.data: dict[str, Any] = data or {}

    def __repr__(self) -> str:
        return f"Sweep({self.workspace.name}/{self.experiment}/{self.name}, " \
            f"{self.data.get('state', '?')})"

    @property
    def client(self) -> Client:
        return self.workspace.client

    @property
    def path(self) -> str:
        return (f"/workspaces/{quote(self.workspace.name, safe='')}/experiments/"
                f"{quote(self.experiment, safe='')}/sweeps/{quote(self.name, safe='')}")

    @classmethod
    def create(cls, spec: SweepSpec | dict[str, Any] | str | Path, *,
               workspace: Workspace | str = "default", experiment: str | None = None,
               cluster: str | None = None, name: str | None = None,
               source_format: str | None = None, client: Client | None = None) -> Sweep:
        """Create a sweep from a SweepSpec, its fields, or a sweep file (native YAML with a
        ``sweep:`` block, AML v2 ``type: sweep``). The trial's code directory is snapshotted
        and uploaded now."""
        from batchyard.sdk.workspace import Workspace
        from batchyard.spec.sweep import SweepSpec, load_sweep_file

        ws = workspace if isinstance(workspace, Workspace) else Workspace(workspace,
                                                                          client=client)
        if isinstance(spec, str | Path):
            spec, found_format = load_sweep_file(Path(spec))
            source_format = source_format or found_format
        model = spec if isinstance(spec, SweepSpec) else SweepSpec.model_validate(spec)
        body = model.model_dump(mode="json", exclude_none=True)
        code = model.trial.code
        if code and not code.startswith("snapshot:"):
            from batchyard.snapshot import pack

            body["trial"]["code"] = f"snapshot:{ws.client.upload_snapshot(pack(code))}"
        result = ws.client.post(f"/workspaces/{quote(ws.name, safe='')}/sweeps", {
            "spec": body, "experiment": experiment, "cluster": cluster, "name": name,
            "source_format": source_format or "native"})
        return cls(ws, result["experiment"], result["name"], data=result)

    @classmethod
    def get(cls, name: str, experiment: str = "default", workspace: str = "default", *,
            client: Client | None = None) -> Sweep:
        sweep = cls(workspace, experiment, name, client=client)
        sweep.refresh()
        return sweep

    def refresh(self) -> dict[str, Any]:
        self.data = self.client.get(self.path)
        return self.data

    @property
    def state(self) -> str:
        return str(self.refresh()["state"])

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.refresh()["state"] not in TERMINAL:
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(poll)
        return self.data

    def cancel(self) -> dict[str, Any]:
        self.data = self.client.post(self.path + "/cancel")
        return self.data

    def trials(self) -> list[dict[str, Any]]:
        """Every trial (index, job name, params, state, objective), best first."""
        rows: list[dict[str, Any]] = self.refresh().get("trials") or []
        return rows

    def trial_jobs(self) -> list[Job]:
        """The trials' jobs, in trial order."""
        rows = sorted(self.trials(), key=lambda t: t["index"])
        return [Job(self.workspace, self.experiment, t["name"]) for t in rows if t["name"]]

    def best_trial(self) -> Job | None:
        best = self.refresh().get("best")
        return Job(self.workspace, self.experiment, best["name"]) if best else None


__all__ = ["Sweep"]
