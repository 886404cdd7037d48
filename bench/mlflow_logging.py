"""``mlflow.log_metric`` in a loop of 1,000 steps: batchyard's tracking API against a real
local ``mlflow server`` (SQLite backend), in the same run.

The same script (the unchanged ``mlflow`` client, one synchronous call per step) runs as a
batchyard job on a 1-node local cluster, logging to the job's run through the server's
MLflow API with its job token, and as a plain process against ``mlflow server`` on loopback.
Each side runs ``--rounds`` times, alternating; the figure is the median time of the loop
(the run's set-up left out). Budget: batchyard at most 2x the real server.

    python bench/mlflow_logging.py [--steps 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import cli, free_port, isolated_server

LOOP = '''
import json, sys, time
import mlflow
steps = int(sys.argv[1])
with mlflow.start_run():
    mlflow.log_metric("warm", 0.0)  # the connection and the run, before the clock starts
    began = time.perf_counter()
    for step in range(steps):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    spent = time.perf_counter() - began
print("LOOP " + json.dumps({"seconds": spent, "steps": steps}), flush=True)
'''


@contextlib.contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    port = free_port()
    log = open(folder / "mlflow-server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1", "--backend-store-uri",
                             f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination",
                             str(folder / "artifacts")],
                            stdout=log, stderr=subprocess.STDOUT, cwd=folder,
                            start_new_session=True)
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not start: "
                                   + (folder / "mlflow-server.log").read_text()[-2000:])
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # its group: its workers and job consumers
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group outlived it
        proc.wait()


def _loop_seconds(output: str) -> float:
    for line in output.splitlines():
        if "LOOP " in line:
            return float(json.loads(line.split("LOOP ", 1)[1])["seconds"])
    raise RuntimeError(f"no LOOP line in:\n{output[-2000:]}")


def against_mlflow(url: str, script: Path, steps: int) -> float:
    env = {**os.environ, "MLFLOW_TRACKING_URI": url, "MLFLOW_EXPERIMENT_NAME": "bench"}
    for key in ("MLFLOW_TRACKING_TOKEN", "MLFLOW_RUN_ID"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(script), str(steps)], env=env, text=True,
                          capture_output=True, timeout=1800, check=True)
    return _loop_seconds(proc.stdout)


def against_batchyard(folder: Path, steps: int, index: int) -> float:
    name = f"loop-{index}"
    (folder / "job.yaml").write_text(f"name: {name}\nexperiment: bench\ncode: .\n"
                                     f"command: python loop.py {steps}\n")
    cli("job", "create", "-f", str(folder / "job.yaml"), "-c", "one", "--wait")
    return _loop_seconds(cli("job", "logs", name, "-e", "bench").stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="batchyard-bench-mlflow-"))
    job = folder / "job"
    job.mkdir()
    (job / "loop.py").write_text(LOOP)
    ours: list[float] = []
    theirs: list[float] = []
    with isolated_server(), mlflow_server(folder) as url:
        cli("cluster", "create", "-n", "one", "-s", "Standard_D2_v2", "-t", "1")
        time.sleep(2)
        for index in range(args.rounds):
            theirs.append(against_mlflow(url, job / "loop.py", args.steps))
            ours.append(against_batchyard(job, args.steps, index))
            print(f"round {index + 1}: mlflow server {theirs[-1]:.2f}s, batchyard "
                  f"{ours[-1]:.2f}s", flush=True)
    mine, real = statistics.median(ours), statistics.median(theirs)
    ratio = mine / real
    print(f"{args.steps} x mlflow.log_metric: mlflow server (SQLite) {real:.2f}s "
          f"({1000 * real / args.steps:.2f} ms a call), batchyard {mine:.2f}s "
          f"({1000 * mine / args.steps:.2f} ms a call) -> batchyard/mlflow = {ratio:.2f}x "
          f"(budget 2x: {'ok' if ratio <= 2.0 else 'OVER'})")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
