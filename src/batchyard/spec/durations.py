"""Durations as users write them: seconds, ``90m``/``1h30m``, ``hh:mm:ss`` and Batch AI's
``d.hh:mm:ss`` (``maxWallClockTime``)."""

from __future__ import annotations

import math
import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_HUMAN = re.compile(r"^(?:(\d+(?:\.\d+)?)\s*([smhdw]))+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_CLOCK = re.compile(r"^(?:(\d+)\.)?(\d{1,2}):(\d{1,2}):(\d{1,2}(?:\.\d+)?)$")


def parse_duration(value: str | int | float) -> float:
    """Seconds in ``value``; raises ValueError with the accepted forms named."""
    if isinstance(value, bool):
        raise ValueError("a duration, not a boolean")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError("a duration too long to keep") from None
        if not math.isfinite(seconds):
            raise ValueError("a finite number of seconds")
        if seconds < 0:
            raise ValueError("must not be negative")
        return seconds
    if not isinstance(value, str):
        raise ValueError(f"a duration, not {type(value).__name__}")
    text = value.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return _finite(float(text))
    clock = _CLOCK.match(text)
    if clock:
        days, hours, minutes, seconds_text = clock.groups()
        if len(days or "") > 9:
            raise ValueError("a duration too long to keep")
        return _finite(int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60
                       + float(seconds_text))
    if _HUMAN.match(text.replace(" ", "")):
        return _finite(sum(float(n) * _UNITS[u] for n, u in _PART.findall(text)))
    raise ValueError(
        f"cannot read duration {value!r}: use seconds, '90m', '1h30m', 'hh:mm:ss' or 'd.hh:mm:ss'"
    )


def _finite(seconds: float) -> float:
    if not math.isfinite(seconds):
        raise ValueError("a duration too long to keep")
    return seconds


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{sec:02d}s"
    return f"{minutes}m{sec:02d}s"
