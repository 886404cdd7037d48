"""How a straggler is picked from the ranks' seconds per step (server/services/stragglers.py):
against the median of the other ranks, so the slow one of two ranks is seen too."""

from __future__ import annotations

from batchyard.server.services.stragglers import slowest, text


def test_the_slow_rank_of_a_gang_is_named_with_its_ratio() -> None:
    assert slowest({0: 0.2, 1: 0.21, 2: 0.19, 3: 0.8}, 1.5) == (3, 0.8, 0.2)


def test_one_slow_rank_of_two_is_seen() -> None:
    found = slowest({0: 0.2, 1: 0.5}, 1.5)
    assert found is not None and found[0] == 1


def test_ranks_within_the_factor_name_nobody() -> None:
    assert slowest({0: 0.2, 1: 0.25, 2: 0.29}, 1.5) is None
    assert slowest({0: 0.2}, 1.5) is None  # nobody to compare with


def test_of_two_slow_ranks_the_slower_is_named() -> None:
    found = slowest({0: 0.1, 1: 0.1, 2: 0.1, 3: 0.4, 4: 0.9}, 1.5)
    assert found is not None and found[0] == 4


def test_job_show_text() -> None:
    assert text(None) is None
    assert text({"rank": 3, "node": "sg-1", "seconds_per_step": 0.8, "ratio": 4.0,
                 "median_seconds_per_step": 0.2}) == \
        "rank 3 on sg-1: 0.8 s a step, 4x the others' median (0.2 s)"
