"""Sizes as users write them (``limits.max_output: 10G``): bytes, or a number with a unit
k, m, g, t (powers of 1024, as ``du -h`` and Docker count), ``B``/``iB`` optional."""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?$")
MAX = 1 << 60


def parse_size(value: str | int) -> int:
    """Bytes in ``value``; ValueError naming the accepted forms."""
    if isinstance(value, bool):
        raise ValueError("a size, not a boolean")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (match := _SIZE.match(value.strip().lower())):
        size = int(float(match.group(1)) * _UNITS[match.group(2)])
    else:
        raise ValueError(f"{str(value)[:40]!r} is not a size: give bytes or a number with a "
                         "unit k, m, g or t (e.g. 10G, 512M)")
    if not 0 < size <= MAX:
        raise ValueError("a size above 0 and below 1 EiB")
    return size


def human(size: int) -> str:
    """``10737418240`` -> ``10G``; ``1610612736`` -> ``1.5G``."""
    for unit in ("P", "T", "G", "M", "K"):
        step = _UNITS[unit.lower()]
        if size >= step:
            return f"{round(size / step, 1):g}{unit}"
    return f"{size}B"
