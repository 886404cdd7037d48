"""Azure-style node sizes, so seed users can keep writing ``-s Standard_NC6``.

A size only describes a node; the local backend gives a virtual node the size's CPUs and
memory as a budget, and only the GPUs this machine really has.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from batchyard.errors import SpecError


@dataclass(frozen=True)
class NodeSize:
    name: str
    vcpus: int
    gpus: int
    memory_gb: float
    family: str
    gpu_model: str | None = None
    infiniband: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _s(name: str, vcpus: int, mem: float, family: str, gpus: int = 0, gpu: str | None = None,
       ib: bool = False) -> NodeSize:
    return NodeSize(name, vcpus, gpus, mem, family, gpu, ib)


CATALOG: dict[str, NodeSize] = {
    s.name.lower(): s
    for s in [
        _s("Standard_D1_v2", 1, 3.5, "standardDv2Family"),
        _s("Standard_D2_v2", 2, 7, "standardDv2Family"),
        _s("Standard_D3_v2", 4, 14, "standardDv2Family"),
        _s("Standard_D4_v2", 8, 28, "standardDv2Family"),
        _s("Standard_D2_v3", 2, 8, "standardDv3Family"),
        _s("Standard_D4_v3", 4, 16, "standardDv3Family"),
        _s("Standard_D8_v3", 8, 32, "standardDv3Family"),
        _s("Standard_DS2_v2", 2, 7, "standardDSv2Family"),
        _s("Standard_F2s_v2", 2, 4, "standardFSv2Family"),
        _s("Standard_F4s_v2", 4, 8, "standardFSv2Family"),
        _s("Standard_F8s_v2", 8, 16, "standardFSv2Family"),
        _s("Standard_H16r", 16, 112, "standardHFamily", ib=True),
        _s("Standard_NC6", 6, 56, "standardNCFamily", 1, "K80"),
        _s("Standard_NC12", 12, 112, "standardNCFamily", 2, "K80"),
        _s("Standard_NC24", 24, 224, "standardNCFamily", 4, "K80"),
        _s("Standard_NC24r", 24, 224, "standardNCFamily", 4, "K80", ib=True),
        _s("Standard_NC6s_v2", 6, 112, "standardNCSv2Family", 1, "P100"),
        _s("Standard_NC24rs_v2", 24, 448, "standardNCSv2Family", 4, "P100", ib=True),
        _s("Standard_NC6s_v3", 6, 112, "standardNCSv3Family", 1, "V100"),
        _s("Standard_NC12s_v3", 12, 224, "standardNCSv3Family", 2, "V100"),
        _s("Standard_NC24s_v3", 24, 448, "standardNCSv3Family", 4, "V100"),
        _s("Standard_NC24rs_v3", 24, 448, "standardNCSv3Family", 4, "V100", ib=True),
        _s("Standard_ND6s", 6, 112, "standardNDSFamily", 1, "P40"),
        _s("Standard_ND24rs", 24, 448, "standardNDSFamily", 4, "P40", ib=True),
        _s("Standard_ND40rs_v2", 40, 672, "standardNDSv2Family", 8, "V100", ib=True),
        _s("Standard_NV6", 6, 56, "standardNVFamily", 1, "M60"),
        _s("Standard_ND96asr_v4", 96, 900, "standardNDASv4Family", 8, "A100", ib=True),
        _s("Standard_NC24ads_A100_v4", 24, 220, "standardNCADSA100v4Family", 1, "A100"),
        _s("Standard_ND96isr_H100_v5", 96, 1900, "standardNDISRH100v5Family", 8, "H100", ib=True),
    ]
}


def lookup(name: str) -> NodeSize:
    size = CATALOG.get(name.lower())
    if size is None:
        names = sorted(s.name for s in CATALOG.values())
        hint = nearest_size(name)
        raise SpecError(f"vm_size: unknown node size {name!r}"
                        + (f"; did you mean {hint}?" if hint else "")
                        + f" (known sizes: {', '.join(names)})")
    return size


def nearest_size(name: str) -> str | None:
    """The size ``name`` most likely meant, compared without the ``Standard_`` every size
    starts with (which would make any word look close): NC6 and Standard_D3 find
    Standard_NC6 and Standard_D3_v2."""
    from batchyard.suggest import nearest

    def bare(text: str) -> str:
        return text[len("standard_"):] if text.lower().startswith("standard_") else text

    by_bare = {bare(s.name): s.name for s in CATALOG.values()}
    found = nearest(bare(name), by_bare, cutoff=0.5)
    return by_bare[found] if found else None


def custom(vcpus: int, gpus: int = 0, memory_gb: float = 4.0) -> NodeSize:
    """A size given as explicit resources (``--cpus/--gpus/--memory``)."""
    if vcpus < 1:
        raise SpecError("cpus: must be at least 1")
    if gpus < 0:
        raise SpecError("gpus: must not be negative")
    family = "customGpuFamily" if gpus else "customCpuFamily"
    return NodeSize(f"custom-{vcpus}c{gpus}g{memory_gb:g}m", vcpus, gpus, memory_gb, family)
