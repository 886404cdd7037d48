"""The CLI as scripts call it, each figure beside its anchor in the same run (issue 37):

* start-up: `batchyard --help` (wall time) and `batchyard job create -f job.yaml` (CPU
  time: user + sys, steadier on a shared machine) against `python -c pass`, in alternated
  rounds (every command once per round, the order rotating); targets: --help <= 3x,
  job create <= 5x in CPU;
* 16 parallel submits (``--parallel``): `batchyard job create -f job.yaml` run by 16 workers
  at once, as `xargs -P16` does, submits per second; anchors: 16 parallel `python -c pass`
  (the ceiling of any Python CLI here) and, with ``--slurm``, 16 parallel `sbatch` on a real
  Slurm (bench/_slurm_anchor.py); target >= 30/s;
* listings: `batchyard job list --all` with 2,000 jobs (``--jobs``; target <= 1 s) and
  `batchyard job list --all -o json` with 10,000 (``--json-jobs``; target <= 2 s), the jobs
  finished ones inserted through the store (bench/_prefill.py), alternated with
  `python -c pass`.

``--against SCRIPT`` (e.g. /work/main/.venv/bin/batchyard) times another batchyard's CLI
beside this one in the same rounds ("old: ..."): the ratio of a change. `batchyard --help` is
timed twice: as it runs once its page is kept (cli/helpcache.py; every run after the first
in a setting) and as a first run, with nowhere to keep it ("no kept page").

Every figure is min/median/max with the load average. The commands run with .pyc files
written once to a cache of their own (an installed batchyard has them; this machine sets
PYTHONDONTWRITEBYTECODE, which would make an editable install compile its modules on every
run). The jobs go to a cluster whose one node takes an hour to provision: they stay queued.

    python bench/cli_startup.py [--runs 15] [--jobs 2000] [--json-jobs 10000] [--parallel 16]
                                [--submits 96] [--slurm] [--against SCRIPT]
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import isolated_server, load

JOB_YAML = "command: 'true'\ndistribution:\n  type: custom\n"


def _batchyard() -> list[str]:
    script = Path(sys.executable).with_name("batchyard")
    if script.is_file():
        return [str(script)]
    found = shutil.which("batchyard")
    return [found] if found else [sys.executable, "-m", "batchyard.cli.main"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="cli-bench-pyc-")
    env["NO_COLOR"] = "1"
    return env


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} failed: {proc.stderr.decode()[-500:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _mmm(values: list[float], scale: float = 1000.0) -> str:
    return (f"{min(values) * scale:7.1f} {statistics.median(values) * scale:7.1f} "
            f"{max(values) * scale:7.1f}")


Case = list[str] | tuple[list[str], dict[str, str]]  # argv, or argv and its own environment


def _case(case: Case, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    return (case[0], {**env, **case[1]}) if isinstance(case, tuple) else (case, env)


def alternated(cases: dict[str, Case], runs: int, env: dict[str, str]
               ) -> dict[str, dict[str, list[float]]]:
    """Each case once per round, the order rotating; a first round not counted (warm)."""
    names = list(cases)
    for name in names:
        _time(*_case(cases[name], env))
    out: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in names}
    for r in range(runs):
        for name in names[r % len(names):] + names[:r % len(names)]:
            wall, cpu = _time(*_case(cases[name], env))
            out[name]["wall"].append(wall)
            out[name]["cpu"].append(cpu)
    return out


def report(title: str, got: dict[str, dict[str, list[float]]], base: str,
           targets: dict[str, tuple[str, float]]) -> dict[str, Any]:
    print(f"\n{title} (load {load()}); ms min/median/max, ratio of medians to {base!r}:")
    bw, bc = (statistics.median(got[base][k]) for k in ("wall", "cpu"))
    out: dict[str, Any] = {}
    for name, v in got.items():
        w, c = statistics.median(v["wall"]), statistics.median(v["cpu"])
        line = (f"  {name:34s} wall {_mmm(v['wall'])}  x{w / bw:5.1f}   cpu {_mmm(v['cpu'])}"
                f"  x{c / bc:5.1f}")
        if name in targets:
            kind, limit = targets[name]
            ratio = (w / bw) if kind == "wall" else (c / bc) if kind == "cpu" else w
            unit = "s" if kind == "abs" else "x"
            ok = "met" if ratio <= limit else "NOT met"
            line += f"   target {kind} <= {limit}{unit}: {ok}"
        print(line)
        out[name] = {"wall_ms": [round(x * 1000, 1) for x in (min(v["wall"]), w,
                                                              max(v["wall"]))],
                     "cpu_ms": [round(x * 1000, 1) for x in (min(v["cpu"]), c, max(v["cpu"]))],
                     "wall_ratio": round(w / bw, 2), "cpu_ratio": round(c / bc, 2)}
    return out


def parallel_rate(argv: list[str], parallel: int, total: int, env: dict[str, str]) -> float:
    def one(_: int) -> int:
        return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=env).returncode

    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        codes = list(pool.map(one, range(total)))
    took = time.perf_counter() - t0
    if any(codes):
        raise RuntimeError(f"{sum(1 for c in codes if c)} of {total} runs of {argv} failed")
    return total / took


def setup(client: Any) -> None:
    client.post("/workspaces/default/clusters", {
        "name": "q", "vm_size": "Standard_D2_v2", "manual": {"target_node_count": 1},
        "provisioning_delay": 3600})
    client.post("/workspaces/default/jobs", {"spec": {"command": "true",
                                                      "distribution": {"type": "custom"}},
                                             "cluster": "q", "name": "template"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--jobs", type=int, default=2000, help="jobs `job list --all` shows")
    parser.add_argument("--json-jobs", type=int, default=10000,
                        help="jobs `job list --all -o json` shows")
    parser.add_argument("--list-runs", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--submits", type=int, default=96, help="submits per parallel round")
    parser.add_argument("--rounds", type=int, default=3, help="parallel rounds")
    parser.add_argument("--slurm", action="store_true", help="add 16 parallel `sbatch`")
    parser.add_argument("--against", metavar="SCRIPT",
                        help="another batchyard script, timed beside this one ('old: ...')")
    args = parser.parse_args()
    by, env = _batchyard(), _env()
    py = [sys.executable, "-c", "pass"]
    work = Path(tempfile.mkdtemp(prefix="cli-bench-"))
    job_file = work / "job.yaml"
    job_file.write_text(JOB_YAML)
    create = [*by, "job", "create", "-f", str(job_file), "-c", "q"]
    result: dict[str, Any] = {"load": [load()]}
    with isolated_server() as home:
        env["BATCHYARD_HOME"] = str(home)
        from batchyard.client.http import Client
        from batchyard.config import database_url

        client = Client.connect(quiet=True)
        setup(client)
        nowhere = {"XDG_CACHE_HOME": "/dev/null/nowhere"}  # no page kept, none replayed
        cases: dict[str, Case] = {
            "python -c pass": py, "batchyard --version": [*by, "--version"],
            "batchyard --help": [*by, "--help"],
            "batchyard --help (no kept page)": ([*by, "--help"], nowhere),
            "batchyard job create -f job.yaml": create}
        old = [args.against] if args.against else []
        if old:
            cases.update({
                "old: batchyard --version": [*old, "--version"],
                "old: batchyard --help": [*old, "--help"],
                "old: batchyard job create -f job.yaml": [*old, *create[len(by):]]})
        got = alternated(cases, args.runs, env)
        result["startup"] = report("start-up", got, "python -c pass", {
            "batchyard --help": ("wall", 3.0), "batchyard --help (no kept page)": ("wall", 3.0),
            "batchyard job create -f job.yaml": ("cpu", 5.0)})
        if old:
            result["startup_against_old"] = against_old(got)
        result["parallel"] = parallel(args, create, py, env)
        listed: dict[str, Any] = {}
        have = 0
        for count, argv, title, limit in (
                (args.jobs, [*by, "job", "list", "--all"], "job list --all", 1.0),
                (args.json_jobs, [*by, "job", "list", "--all", "-o", "json"],
                 "job list --all -o json", 2.0)):
            from _prefill import prefill

            prefill(database_url(), count - have, "many", "q", "succeeded", start=have)
            have = count
            rows = len(client.get("/workspaces/default/jobs"))  # no limit: every job
            name = f"batchyard {title} ({rows} jobs)"
            listing: dict[str, Case] = {"python -c pass": py, name: argv}
            if old:
                listing[f"old: {name}"] = [*old, *argv[len(by):]]
            got = alternated(listing, args.list_runs, env)
            listed[title] = report(f"{title}, {rows} jobs in the workspace", got,
                                   "python -c pass", {name: ("abs", limit)})
            if old:
                listed[title]["against_old"] = against_old(got)
        result["list"] = listed
        client.close()
    shutil.rmtree(env["PYTHONPYCACHEPREFIX"], ignore_errors=True)
    result["load"].append(load())
    print(json.dumps(result))
    return 0


def against_old(got: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """This CLI's medians over the other's (``--against``), wall and CPU."""
    print("\nthis CLI against the old one (ratio of medians, wall / cpu):")
    out: dict[str, Any] = {}
    for name in got:
        if not name.startswith("old: ") or name[5:] not in got:
            continue
        new, old = got[name[5:]], got[name]
        w = statistics.median(new["wall"]) / statistics.median(old["wall"])
        c = statistics.median(new["cpu"]) / statistics.median(old["cpu"])
        print(f"  {name[5:]:34s} wall x{w:5.2f}   cpu x{c:5.2f}")
        out[name[5:]] = {"wall": round(w, 3), "cpu": round(c, 3)}
    return out


def parallel(args: argparse.Namespace, create: list[str], py: list[str],
             env: dict[str, str]) -> dict[str, Any]:
    """Alternated rounds of ``--submits`` runs from ``--parallel`` workers: batchyard's
    submits, `python -c pass` and (``--slurm``) held `sbatch` submits."""
    rates: dict[str, list[float]] = {"batchyard job create": [], "python -c pass": []}
    slurm_ctx: Any = None
    anchor = None
    if args.slurm:
        from _slurm_anchor import slurm

        slurm_ctx = slurm()
        anchor = slurm_ctx.__enter__()
        rates["sbatch (held)"] = []
    try:
        for r in range(args.rounds):
            order = list(rates)
            for name in order[r % len(order):] + order[:r % len(order)]:
                if name == "batchyard job create":
                    rates[name].append(parallel_rate(create, args.parallel, args.submits, env))
                elif name == "python -c pass":
                    rates[name].append(parallel_rate(py, args.parallel, args.submits, env))
                else:
                    assert anchor is not None
                    rates[name].append(anchor.submits(args.parallel, args.submits)["rate"])
    finally:
        if slurm_ctx is not None:
            slurm_ctx.__exit__(None, None, None)
    print(f"\n{args.parallel} parallel runs, {args.submits} per round, {args.rounds} alternated "
          f"rounds (load {load()}); runs/s min/median/max:")
    ours = statistics.median(rates["batchyard job create"])
    out: dict[str, Any] = {}
    for name, values in rates.items():
        med = statistics.median(values)
        line = (f"  {name:24s} {min(values):7.1f} {med:7.1f} {max(values):7.1f}/s")
        if name != "batchyard job create":
            line += f"   batchyard / this: {ours / med:.3f}"
        else:
            line += f"   target >= 30/s: {'met' if med >= 30 else 'NOT met'}"
        print(line)
        out[name] = [round(min(values), 1), round(med, 1), round(max(values), 1)]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
