"""CLI start-up: wall time of `batchyard --help`, `batchyard version` and `batchyard job list`
(a few jobs, against a local server already running) beside `python -c pass` and
`python -c "import typer"`, in one run, median of ``--runs`` alternating runs. Where
PYTHONDONTWRITEBYTECODE is set (no .pyc files are written: an editable install compiles its
own modules on every run), `--help` is measured again with .pyc files, as an installed
`batchyard` has them.

Each command is the installed console script (what a user types), falling back to
``python -m batchyard.cli.main``. Targets: `--help` < 100 ms, `job list` < 200 ms (on a
machine where `python -c pass` takes ~10 ms; the ratios carry across machines).

    python bench/cli_startup.py [--runs 21]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import isolated_server


def _batchyard() -> list[str]:
    script = Path(sys.executable).with_name("batchyard")
    if script.is_file():
        return [str(script)]
    found = shutil.which("batchyard")
    return [found] if found else [sys.executable, "-m", "batchyard.cli.main"]


def _time(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                   env=os.environ if env is None else env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _submit_jobs(count: int) -> None:
    from batchyard.client.http import Client

    client = Client.connect(quiet=True)
    client.post("/workspaces/default/clusters", {"name": "bench1", "vm_size": "Standard_D2_v2",
                                                 "manual": {"target_node_count": 1}})
    for i in range(count):
        client.post("/workspaces/default/jobs", {"spec": {"command": "true"},
                                                 "cluster": "bench1", "name": f"j{i}"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = client.get("/workspaces/default/jobs")
        if all(r["state"] in ("succeeded", "failed", "canceled") for r in rows):
            break
        time.sleep(0.2)
    client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--jobs", type=int, default=5, help="jobs `job list` shows")
    args = parser.parse_args()
    by = _batchyard()
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        'python -c "import typer"': [sys.executable, "-c", "import typer"],
        "batchyard --help": [*by, "--help"],
        "batchyard version": [*by, "version"],
        "batchyard job list": [*by, "job", "list"],
    }
    envs: dict[str, dict[str, str]] = {}
    with isolated_server():
        _submit_jobs(args.jobs)
        if sys.flags.dont_write_bytecode:
            # PYTHONDONTWRITEBYTECODE: an editable install's own modules compile on every run;
            # an installed one has .pyc files, as this row has (written once, to a cache of
            # its own)
            pyc = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            pyc["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="cli-startup-pyc-")
            cases["batchyard --help, .pyc"] = cases["batchyard --help"]
            envs["batchyard --help, .pyc"] = pyc
        for name, argv in cases.items():  # warm the page cache and .pyc files
            _time(argv, envs.get(name))
        times: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, argv in cases.items():
                wall, used = _time(argv, envs.get(name))
                times[name].append(wall)
                cpu[name].append(used)
    for env in envs.values():
        shutil.rmtree(env["PYTHONPYCACHEPREFIX"], ignore_errors=True)
    med = {name: statistics.median(values) for name, values in times.items()}
    med_cpu = {name: statistics.median(values) for name, values in cpu.items()}
    base, typer_t = med["python -c pass"], med['python -c "import typer"']
    print(f"CLI start-up, median of {args.runs} runs ({' '.join(by)}); wall time, ratios to "
          "python and to typer's import, and CPU time (user+sys, steadier on a busy machine):")
    for name, value in med.items():
        print(f"  {name:26s} {value * 1000:7.1f} ms   x{value / base:5.1f} python"
              f"   x{value / typer_t:4.2f} typer   cpu {med_cpu[name] * 1000:6.1f} ms")
    print(json.dumps({"wall_ms": {name: round(v * 1000, 1) for name, v in med.items()},
                      "cpu_ms": {name: round(v * 1000, 1) for name, v in med_cpu.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
