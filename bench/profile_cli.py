"""Where a CLI call's time goes (issue 37, section 3): for `batchyard --help`, `job create -f`,
`job list --all` (``--jobs`` jobs) and `job list --all -o json` (``--json-jobs``), against a
bench server: the imports (``python -X importtime``: the biggest cumulative imports, and the
total), and a cProfile of the whole call (the functions with the most cumulative time).

    python bench/profile_cli.py [--jobs 2000] [--json-jobs 10000] [--top 20]

Run with .pyc files (written once to a cache of its own), as an installed batchyard has them.
"""

from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import isolated_server, load
from cli_startup import JOB_YAML, _env, setup

MODULE = [sys.executable, "-m", "batchyard.cli.main"]


def imports(argv: list[str], env: dict[str, str], top: int) -> str:
    proc = subprocess.run([sys.executable, "-X", "importtime", *MODULE[1:], *argv],
                          capture_output=True, text=True, env=env)
    rows: list[tuple[int, int, str]] = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        fields = line[len("import time:"):].split("|", 2)
        rows.append((int(fields[1]), int(fields[0]), fields[2][1:]))  # nested: indented
    roots = sum(t for t, _, n in rows if not n.startswith(" "))
    lines = [f"  imports (-X importtime, wall clock): {roots / 1000:.0f} ms in all "
             f"({len(rows)} modules); biggest cumulative:"]
    for cumulative, own, name in sorted(rows, reverse=True)[:top]:
        lines.append(f"    {cumulative / 1000:7.1f} ms (own {own / 1000:5.1f})  {name.strip()}")
    return "\n".join(lines)


RUNNER = """
import cProfile, runpy, sys, time
out = sys.argv[1]
sys.argv = ["batchyard", *sys.argv[2:]]
prof = cProfile.Profile(time.process_time)
prof.enable()
try:
    runpy.run_module("batchyard.cli.main", run_name="__main__")
except SystemExit:
    pass
prof.disable()
prof.dump_stats(out)
"""
WRAPPERS = ("<module>", "run_module", "_run_code", "_run_module_code",
            "<built-in method builtins.exec>")


def _shown(key: tuple[str, int, str]) -> bool:
    """Neither a wrapper of the whole run nor the import machinery."""
    path, _line, func = key
    if path == "~":
        return "exec" not in func
    return func not in WRAPPERS and "importlib" not in path and func != "_find_and_load"


def profile(argv: list[str], env: dict[str, str], top: int) -> str:
    """cProfile with a CPU clock (process time: a busy machine's waits are not counted)."""
    out = Path(tempfile.mkdtemp()) / "prof"
    subprocess.run([sys.executable, "-c", RUNNER, str(out), *argv], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env=env, check=False)
    stats = pstats.Stats(str(out))
    raw = stats.stats  # type: ignore[attr-defined]
    total = max(ct for (_cc, _nc, _tt, ct, _callers) in raw.values())
    imported = sum(ct for (path, _l, func), (_cc, _nc, _tt, ct, _c) in raw.items()
                   if func == "_find_and_load")
    lines = [f"  CPU (cProfile, process time; profiling inflates it): {total * 1000:.0f} ms, of "
             f"it imports {imported * 1000:.0f} ms ({100 * imported / total:.0f} %); most "
             "cumulative of batchyard's and rich's functions, imports left out:"]
    chain = ("main", "_main", "__call__", "invoke")
    ours = sorted(((key, value) for key, value in raw.items() if _shown(key)
                   and ("batchyard" in key[0] or "rich" in key[0]) and key[2] not in chain),
                  key=lambda kv: -kv[1][3])
    for (path, lineno, func), (_cc, _nc, _tt, ct, _callers) in ours[:top]:
        where = "/".join(Path(path).parts[-2:])
        lines.append(f"    {ct * 1000:7.1f} ms {100 * ct / total:5.1f}%  {func} ({where}:{lineno})")
    lines.append("  most own time:")
    own = sorted(raw.items(), key=lambda kv: -kv[1][2])
    for (path, lineno, func), (_cc, _nc, tt, _ct, _callers) in own[:top]:
        where = "/".join(Path(path).parts[-2:]) if path != "~" else "builtin"
        lines.append(f"    {tt * 1000:7.1f} ms {100 * tt / total:5.1f}%  {func} ({where}:{lineno})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--json-jobs", type=int, default=10000)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    env = _env()
    work = Path(tempfile.mkdtemp(prefix="cli-prof-"))
    (work / "job.yaml").write_text(JOB_YAML)
    with isolated_server() as home:
        env["BATCHYARD_HOME"] = str(home)
        from batchyard.client.http import Client
        from batchyard.config import database_url

        client = Client.connect(quiet=True)
        setup(client)
        from _prefill import prefill

        cases = [("batchyard --help", ["--help"], 0),
                 ("batchyard job create -f job.yaml", ["job", "create", "-f",
                                                       str(work / "job.yaml"), "-c", "q"], 0),
                 (f"batchyard job list --all ({args.jobs} jobs)", ["job", "list", "--all"],
                  args.jobs),
                 (f"batchyard job list --all -o json ({args.json_jobs} jobs)",
                  ["job", "list", "--all", "-o", "json"], args.json_jobs)]
        have = 0
        for title, argv, jobs in cases:
            if jobs > have:
                prefill(database_url(), jobs - have, "many", "q", "succeeded", start=have)
                have = jobs
            subprocess.run([*MODULE, *argv], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=env)  # .pyc files written
            print(f"{title} (load {load()}):")
            print(imports(argv, env, args.top))
            print(profile(argv, env, args.top), flush=True)
        client.close()
    os.environ.pop("BATCHYARD_HOME", None)


if __name__ == "__main__":
    main()
