"""azureml.train.hyperdrive.HyperDriveRun: a batchyard sweep seen the Azure ML way. Its
children are the trials' runs; ``get_best_run_by_primary_metric`` picks by the sweep's
objective (the primary metric's last value of each run)."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

from batchyard.compat.azureml._common import aml_status
from batchyard.compat.azureml.core.run import Run
from batchyard.sdk.sweep import Sweep

if TYPE_CHECKING:
    from batchyard.compat.azureml.core.experiment import Experiment


class HyperDriveRun:
    type = "hyperdrive"

    def __init__(self, experiment: Experiment, run_id: str, _sweep: Sweep | None = None,
                 **_ignored: Any) -> None:
        self.experiment = experiment
        self._id = run_id
        self._sweep = _sweep or Sweep(experiment.workspace.sdk, experiment.name, run_id)

    @property
    def id(self) -> str:
        return self._id

    @property
    def sweep(self) -> Sweep:
        """The batchyard sweep behind this run."""
        return self._sweep

    def __repr__(self) -> str:
        return (f"Run(Experiment: {self.experiment.name},\nId: {self.id},\nType: {self.type},"
                f"\nStatus: {self.get_status()})")

    def get_status(self) -> str:
        return aml_status(self._sweep.state)

    @property
    def status(self) -> str:
        return self.get_status()

    def get_portal_url(self) -> str:
        from urllib.parse import quote

        return self._sweep.client.url + "/ws/{}/exp/{}/sweeps/{}".format(
            *(quote(p, safe="") for p in (self._sweep.workspace.name, self.experiment.name,
                                          self.id)))

    def _child(self, name: str, data: dict[str, Any] | None = None) -> Run:
        return Run(self.experiment, name, _run_dto=data)

    def get_children(self, recursive: bool = False, tags: Any = None, properties: Any = None,
                     type: str | None = None, status: str | None = None,
                     **_ignored: Any) -> list[Run]:
        """The trials' runs, newest first (as Azure ML lists children)."""
        runs = [self._child(job.name) for job in reversed(self._sweep.trial_jobs())]
        if status is not None:
            runs = [r for r in runs if r.get_status() == status]
        return runs

    def get_children_sorted_by_primary_metric(self, top: int = 0, reverse: bool = False,
                                              discard_no_metric: bool = False
                                              ) -> list[dict[str, Any]]:
        rows = [{"run_id": t["name"], "hyperparameters": json.dumps(t["params"]),
                 "best_primary_metric": t["objective"], "status": aml_status(t["state"])}
                for t in self._sweep.trials()]
        if discard_no_metric:
            rows = [r for r in rows if r["best_primary_metric"] is not None]
        if reverse:
            rows.reverse()
        return rows[:top] if top else rows

    def get_best_run_by_primary_metric(self, include_failed: bool = True,
                                       include_canceled: bool = True,
                                       include_resume_from_runs: bool = True) -> Run | None:
        """The run with the best primary metric (its last logged value), or None."""
        skip = set() if include_failed else {"failed"}
        if not include_canceled:
            skip.add("canceled")
        best = self._sweep.refresh().get("best")
        if best is not None and include_failed and include_canceled:
            return self._child(best["name"])
        for trial in self._sweep.trials():  # best first
            if trial["objective"] is not None and trial["state"] not in skip:
                return self._child(trial["name"])
        return None

    def get_hyperparameters(self) -> dict[str, str]:
        return {t["name"]: json.dumps(t["params"]) for t in self._sweep.trials()}

    def get_metrics(self, name: str | None = None, recursive: bool = False,
                    run_type: str | None = None, populate: bool = False
                    ) -> dict[str, dict[str, Any]]:
        """Every child's metrics, by child run id."""
        return {run.id: run.get_metrics(name) for run in self.get_children()}

    def get_details(self) -> dict[str, Any]:
        data = self._sweep.refresh()
        return {"runId": self.id, "target": data.get("cluster"),
                "status": aml_status(data["state"]),
                "properties": {"primary_metric_config": json.dumps({
                    "name": data["objective"]["primary_metric"],
                    "goal": data["objective"]["goal"]}),
                    "best_child_run_id": (data.get("best") or {}).get("name")},
                "message": data.get("message")}

    def wait_for_completion(self, show_output: bool = False,
                            wait_post_processing: bool = False,
                            raise_on_error: bool = True) -> dict[str, Any]:
        seen = -1
        while self._sweep.refresh()["state"] not in ("succeeded", "failed", "canceled"):
            if show_output and self._sweep.data["trials_created"] != seen:
                seen = self._sweep.data["trials_created"]
                print(f"{self.id}: {seen} runs created, {self._sweep.data['trial_states']}",
                      flush=True)
            time.sleep(1.0)
        details = self.get_details()
        if show_output:
            print(f"{self.id}: {details['status']}: {details.get('message')}", file=sys.stdout,
                  flush=True)
        if raise_on_error and details["status"] == "Failed":
            from batchyard.compat.azureml.exceptions import ActivityFailedException

            raise ActivityFailedException(error_details=details.get("message"))
        return details

    def cancel(self) -> None:
        self._sweep.cancel()


__all__ = ["HyperDriveRun"]
