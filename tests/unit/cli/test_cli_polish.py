"""Help and output polish (issue 33 #18), through the real entry point without a server:
root help lists the nouns (workspace, cluster, job, ...) before the tools (portal, agent,
usage, version, completion); `job list -e` says one thing about its default; a limit that
is not set reads "no GPU limit", never "None GPUs"."""

from __future__ import annotations

import os
import re
import subprocess
import sys

NOUNS = ("workspace", "cluster", "experiment", "job", "sweep", "datastore")
TOOLS = ("portal", "agent", "usage", "version", "completion", "server")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHYARD_")}
    env.update({"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"})
    return subprocess.run([sys.executable, "-m", "batchyard.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def listed(text: str) -> list[str]:
    """The command names root help lists, in order (after its options)."""
    commands = text[text.index("Commands"):]
    return re.findall(r"^\W*([a-z][a-z-]+)\s{2,}\S", commands, re.MULTILINE)


def test_root_help_lists_the_nouns_first() -> None:
    names = listed(run("--help").stdout)
    assert set(NOUNS) | set(TOOLS) <= set(names), names
    last_noun = max(names.index(n) for n in NOUNS)
    first_tool = min(names.index(t) for t in TOOLS)
    assert last_noun < first_tool, names
    assert [n for n in names if n in NOUNS] == list(NOUNS)


def test_job_list_experiment_help_says_one_thing() -> None:
    for group in ("job", "sweep"):
        text = run(group, "list", "--help").stdout
        assert "all experiments unless -e" in " ".join(text.split())
        option = next(line for line in text.splitlines() if "--experiment" in line)
        assert "every experiment" in option, text
        assert "'default'" not in option, text


def test_an_unset_limit_is_no_limit_not_none() -> None:
    from batchyard.cli.main import quota_text

    assert quota_text(None, "GPU") == "no GPU limit"
    assert quota_text(48, "vCPU") == "48 vCPUs"
    assert quota_text(1, "GPU") == "1 GPU"
    assert quota_text(0, "GPU") == "0 GPUs"
