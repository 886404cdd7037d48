"""``pip_packages`` for a job, installed safely: never into the interpreter batchyard itself
runs on, but with ``pip install --target`` into a directory of the job on each node, which
the ranks then find on ``PYTHONPATH``. Requirements already satisfied by the job's
interpreter are not installed again (so ``pip_packages=['torch']`` costs nothing when torch
is there). Only plain requirement specifiers are accepted (no pip options, URLs or paths).

Run on each node by the job's preparation step: ``python -m batchyard.sdk.pip REQ...``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence

from batchyard.errors import SpecError

TARGET = "$AZ_BATCHAI_JOB_TEMP/pip-packages"
_REQ = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"  # name
    r"(?:\[[A-Za-z0-9._,-]+\])?"  # extras
    r"(?:\s*(?:===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!_-]+"
    r"(?:\s*,\s*(?:===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!_-]+)*)?$"
)


def check_requirements(packages: Sequence[str], field: str = "pip_packages") -> list[str]:
    """The requirements, validated: each must be a plain specifier like ``numpy>=1.20``."""
    out = []
    for index, raw in enumerate(packages):
        req = str(raw).strip()
        if not _REQ.match(req):
            raise SpecError(f"{field}[{index}]: {raw!r} is not a plain requirement such as "
                            "'numpy' or 'torch>=2.1' (pip options, URLs and paths are not "
                            "accepted here)")
        out.append(req)
    return out


def prepare_command(packages: Sequence[str]) -> str:
    """The shell step that installs ``packages`` on a node (validated first)."""
    reqs = check_requirements(packages)
    return shlex.join(["python", "-m", "batchyard.sdk.pip", *reqs])


def wrap_command(command: str | list[str]) -> str:
    """``command`` with the job's pip directory first on PYTHONPATH."""
    user = shlex.join(command) if isinstance(command, list) else command
    return f'export PYTHONPATH="{TARGET}${{PYTHONPATH:+:$PYTHONPATH}}"; {user}'


def _satisfied(req: str) -> bool:
    from importlib import metadata

    name = re.split(r"[\[<>=!~\s]", req, maxsplit=1)[0]
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    spec = req[len(name):].strip()
    if spec.startswith("["):
        spec = spec[spec.index("]") + 1:].strip()
    if not spec:
        return True
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:  # pragma: no cover - packaging ships with pip and setuptools
        return False
    return SpecifierSet(spec).contains(installed, prereleases=True)


def main(argv: list[str] | None = None) -> int:
    reqs = check_requirements(sys.argv[1:] if argv is None else argv)
    base = os.environ.get("AZ_BATCHAI_JOB_TEMP")
    if not base:
        print("pip_packages: not inside a batchyard job (AZ_BATCHAI_JOB_TEMP unset)",
              file=sys.stderr)
        return 2
    target = os.path.join(base, "pip-packages")
    os.makedirs(target, exist_ok=True)
    sys.path.insert(0, target)
    missing = [r for r in reqs if not _satisfied(r)]
    if not missing:
        print(f"pip_packages: already installed: {' '.join(reqs)}")
        return 0
    print(f"pip_packages: installing {' '.join(missing)} into {target}", flush=True)
    argv = [sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
            "--target", target, *missing]
    try:
        code = subprocess.call(argv)
    except OSError as exc:
        print(f"pip_packages: cannot run pip: {exc}", file=sys.stderr)
        return 3
    if code != 0:
        print(f"pip_packages: pip install {' '.join(missing)} failed (exit {code})",
              file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
