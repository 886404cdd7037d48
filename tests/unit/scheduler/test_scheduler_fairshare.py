"""Fair share within a priority class (issue 35): Slurm's classic tree over teams and people,
an admission charge that shares one pass's free nodes out, backfill kept, reasons in words."""

from __future__ import annotations

from dataclasses import replace

from scheduler_builders import cluster, job, nodes, placed, running, snap

from batchyard.scheduler import AccountView, FairShareView, schedule
from batchyard.scheduler.fairshare import FairShare

GPU = cluster(1, gpus=4)


def _accounts(usage: dict[int, float] | None = None) -> FairShareView:
    usage = usage or {}
    accounts = {1: AccountView(1, "vision", "ann", usage=usage.get(1, 0.0)),
                2: AccountView(2, "nlp", "bob", usage=usage.get(2, 0.0))}
    return FairShareView(accounts, {"vision": 1.0, "nlp": 1.0})


def _jobs(account: int, first: int, count: int, **kw: object) -> list:
    return [replace(job(first + i, **kw), account=account) for i in range(count)]  # type: ignore[arg-type]


def test_one_pass_interleaves_teams_of_equal_shares() -> None:
    queued = _jobs(1, 1, 10) + _jobs(2, 11, 10)
    s = replace(snap([GPU], nodes(1, 4, first_id=100), queued), fairshare=_accounts())
    order = [p.job_id for p in schedule(s).placements]
    assert order == [1, 11, 2, 12]


def test_without_fair_share_the_order_is_fifo() -> None:
    queued = _jobs(1, 1, 10) + _jobs(2, 11, 10)
    assert [p.job_id for p in schedule(snap([GPU], nodes(1, 4, first_id=100),
                                            queued)).placements] == [1, 2, 3, 4]


def test_the_team_under_its_share_goes_first_and_the_reason_says_why() -> None:
    queued = _jobs(1, 1, 3) + _jobs(2, 11, 3)
    used = 41 * 3600.0  # GPU-seconds
    fs = _accounts({1: used})
    fs = replace(fs, accounts={1: replace(fs.accounts[1], gpu_hours=41.0),
                               2: fs.accounts[2]}, teams={"vision": 1.0, "nlp": 3.0})
    s = replace(snap([GPU], nodes(1, 1, first_id=100), queued), fairshare=fs)
    plan = schedule(s)
    assert list(placed(plan)) == [11]
    reason = plan.pending[1]
    assert reason.startswith("team vision is over its fair share (used 41 GPU-h, share 25 %); "
                             "2 jobs of team nlp go first"), reason
    assert "nlp" not in plan.pending[12].split(";")[0]


def test_priority_still_comes_before_fair_share() -> None:
    queued = _jobs(1, 1, 2, priority=2) + _jobs(2, 11, 2)
    s = replace(snap([GPU], nodes(1, 2, first_id=100), queued),
                fairshare=_accounts({1: 1e9}))
    assert sorted(placed(schedule(s))) == [1, 2]


def test_backfill_is_kept() -> None:
    """Team nlp's 2-node job waits for nodes (the head); vision's short 1-node job still
    starts on the idle node, as it cannot delay it."""
    queued = [replace(job(1, 2), account=2), replace(job(2, 1, wall=60.0), account=1)]
    s = replace(snap([GPU], nodes(1, 1, first_id=100) + nodes(1, 1, "running", first_id=101,
                                                             job_id=50), queued,
                     run=[running(50, [101], started=0.0, wall=3600.0)]),
                fairshare=_accounts({1: 1e6}))
    plan = schedule(s)
    assert list(placed(plan)) == [2]
    assert plan.placements[0].backfill


def test_shares_inside_a_team() -> None:
    """Two people of one team: the one with more shares (and equal usage) goes first."""
    accounts = {1: AccountView(1, "vision", "ann", shares=1.0, usage=100.0),
                2: AccountView(2, "vision", "cid", shares=3.0, usage=100.0)}
    fs = FairShare(FairShareView(accounts, {"vision": 1.0}), {1: GPU}, [], 0.0)
    assert fs.key(2) < fs.key(1)


def test_running_jobs_are_charged_until_they_ran_the_charge() -> None:
    fs_view = _accounts()
    fresh = FairShare(fs_view, {1: GPU}, [replace(running(9, [1], started=0.0, wall=None),
                                                  account=1)], now=10.0)
    assert fresh.usage[1] == (3600.0 - 10.0) * 4
    old = FairShare(fs_view, {1: GPU}, [replace(running(9, [1], started=0.0, wall=None),
                                                account=1)], now=7200.0)
    assert old.usage[1] == 0.0


def test_a_held_team_waits_with_its_budget_named() -> None:
    queued = _jobs(1, 1, 2) + _jobs(2, 11, 1)
    s = replace(snap([GPU], nodes(1, 4, first_id=100), queued), fairshare=_accounts(),
                held_teams={"vision": "budget of team vision (500 GPU-h a month) is spent"})
    plan = schedule(s)
    assert list(placed(plan)) == [11]
    assert plan.pending[1] == plan.pending[2] == \
        "budget of team vision (500 GPU-h a month) is spent"
