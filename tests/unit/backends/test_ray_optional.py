"""batchyard works without Ray: the registry names the ray backend lazily, importing the
backend module does not import Ray, and asking for it without Ray says how to install it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import strictkit
from batchyard.backends import available, get_backend
from batchyard.backends.base import SupportsDiscovery
from batchyard.errors import SpecError

WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # any `import ray` now fails, as on a machine without Ray
import batchyard.backends.ray as rb
import batchyard.server.discovery
from batchyard.backends import get_backend
assert "ray" not in [m for m in sys.modules if sys.modules[m] is not None]
backend = get_backend("local")
print("ok", rb.resource_name("big"))
"""


def test_ray_is_registered() -> None:
    assert "ray" in available()


def test_batchyard_imports_without_ray() -> None:
    proc = subprocess.run([sys.executable, "-c", WITHOUT_RAY], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ok batchyard/big" in proc.stdout


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(SpecError, match=r"batchyard\[ray\]"):
        get_backend("ray")


def test_ray_backend_discovers_instead_of_provisioning() -> None:
    strictkit.importorskip("ray")
    backend = get_backend("ray")
    assert isinstance(backend, SupportsDiscovery)
    with pytest.raises(SpecError, match="discovered"):
        backend.provision_node("big", "default", 0, {})
