"""The ``azureml`` package a job's ranks import: batchyard's AML v1 compat under Azure ML's own
module names, so that a training script's ``from azureml.core.run import Run`` works
unchanged inside a job (only the notebook side changes its imports).

It lives in a per-node directory put first on the ranks' PYTHONPATH (node/env.py), never in
an environment's site-packages: outside a job there is no ``azureml``. ``azureml`` and every
``azureml.X`` are the very module objects of ``batchyard.compat.azureml[.X]`` (aliases, not
copies), so classes and the context run are one, whichever name imported them. Standard
library only (the launcher runs under ``python -S``).
"""

from __future__ import annotations

from pathlib import Path

SHIM = '''\
"""azureml, inside a batchyard job: batchyard.compat.azureml under Azure ML's module names."""

import importlib
import importlib.abc
import importlib.util
import sys

_REAL = "batchyard.compat.azureml"


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """azureml.X is batchyard.compat.azureml.X (the same module object)."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("azureml."):
            return None
        real = _REAL + name[len("azureml"):]
        try:
            found = importlib.util.find_spec(real)
        except ImportError:
            return None
        if found is None:
            return None
        return importlib.util.spec_from_loader(name, self,
                                               is_package=found.submodule_search_locations
                                               is not None)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        sys.modules[module.__name__] = importlib.import_module(
            _REAL + module.__name__[len("azureml"):])


try:
    _compat = importlib.import_module(_REAL)
except ImportError as exc:
    raise ImportError(
        "azureml in a batchyard job is batchyard's AML compat, but this job's Python ("
        + sys.executable + ") cannot import batchyard (" + str(exc) + "): install batchyard "
        "into environment.python's environment") from exc
if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())
sys.modules[__name__] = _compat
'''


def write_pyshim(directory: Path) -> Path:
    """Write the shim package under ``directory`` (the PYTHONPATH entry) and return it."""
    package = directory / "azureml"
    package.mkdir(parents=True, exist_ok=True)
    init = package / "__init__.py"
    if not init.is_file() or init.read_text() != SHIM:
        init.write_text(SHIM)
    return directory
