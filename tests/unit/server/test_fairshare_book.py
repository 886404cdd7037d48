"""Pure parts of fair-share usage and budgets: the decay integral, the half-life setting,
calendar periods."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from batchyard.server.fairshare_book import (
    DEFAULT_HALF_LIFE,
    HALF_LIFE_ENV,
    decayed,
    half_life,
    units_of,
)
from batchyard.server.services.chargeback import period_start

DAY = 86400.0


def test_usage_one_half_life_ago_counts_half() -> None:
    half = 7 * DAY
    now = 100 * DAY
    recent = decayed(4, now - 60, now, now, half)
    old = decayed(4, now - half - 60, now - half, now, half)
    assert recent == pytest.approx(240, rel=1e-4)
    assert old == pytest.approx(120, rel=1e-4)


def test_decay_sums_over_split_intervals() -> None:
    half, now = 3600.0, 10_000.0
    whole = decayed(2, 1000, 9000, now, half)
    parts = decayed(2, 1000, 5000, now, half) + decayed(2, 5000, 9000, now, half)
    assert whole == pytest.approx(parts)
    assert decayed(2, 9000, 1000, now, half) == 0.0
    k = math.log(2) / half
    assert whole == pytest.approx(2 / k * (math.exp(-k * 1000) - math.exp(-k * 9000)))


def test_half_life_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HALF_LIFE_ENV, raising=False)
    assert half_life() == DEFAULT_HALF_LIFE == 7 * DAY
    monkeypatch.setenv(HALF_LIFE_ENV, "2d")
    assert half_life() == 2 * DAY
    monkeypatch.setenv(HALF_LIFE_ENV, "nonsense")
    assert half_life() == DEFAULT_HALF_LIFE


def test_units_of_a_size() -> None:
    assert units_of({"gpus": 4, "vcpus": 24}) == (4.0, True)
    assert units_of({"gpus": 0, "vcpus": 2}) == (2.0, False)
    assert units_of(None) == (1.0, False)


def test_calendar_periods_in_utc() -> None:
    at = dt.datetime(2026, 12, 10, 15, 30, tzinfo=dt.UTC).timestamp()  # a Thursday
    assert period_start("day", at) == dt.datetime(2026, 12, 10, tzinfo=dt.UTC).timestamp()
    assert period_start("week", at) == dt.datetime(2026, 12, 7, tzinfo=dt.UTC).timestamp()
    assert period_start("month", at) == dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()
