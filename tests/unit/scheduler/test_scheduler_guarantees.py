"""Guaranteed capacity, borrowing and reclaim (issue 35 §2): the pure rules of
scheduler.guarantees, through schedule() and reclaim()."""

from __future__ import annotations

from dataclasses import replace

from scheduler_builders import busy_nodes, cluster, job, nodes, placed, snap

from batchyard.scheduler import RunningJobView, schedule
from batchyard.scheduler.guarantees import Holder, choose, given_back_text, reclaim
from batchyard.scheduler.model import Guarantee, GuaranteeView, JobView

GPU = cluster(1, gpus=4)  # 4 GPUs a node
VISION, NLP = 1, 2  # accounts
TEAMS = {VISION: "vision", NLP: "nlp"}


def _view(vision: int = 2, limit: int | None = None, nlp: Guarantee | None = None
          ) -> GuaranteeView:
    own = {"vision": Guarantee(vision)}
    if nlp is not None:
        own["nlp"] = nlp
    elif limit is not None:
        own["nlp"] = Guarantee(0, limit)
    return GuaranteeView({1: own}, dict(TEAMS))


def _job(jid: int, account: int, count: int = 1, **kw: object) -> JobView:
    return replace(job(jid, count, **kw), account=account)  # type: ignore[arg-type]


def _run(jid: int, account: int, node_ids: tuple[int, ...], started: float = 0.0
         ) -> RunningJobView:
    return RunningJobView(jid, 1, node_ids, started, None, account=account)


def test_idle_guarantee_is_borrowed_and_the_placement_says_from_whom() -> None:
    s = replace(snap([GPU], nodes(1, 4, first_id=100), [_job(1, NLP, 3)]),
                guarantees=_view())
    plan = schedule(s)
    assert 1 in placed(plan)
    assert plan.borrowed == {1: "vision"}


def test_a_team_within_its_guarantee_does_not_borrow() -> None:
    s = replace(snap([GPU], nodes(1, 4, first_id=100), [_job(1, VISION, 2)]),
                guarantees=_view())
    plan = schedule(s)
    assert 1 in placed(plan) and plan.borrowed == {}


def test_borrowers_leave_the_nodes_an_owners_queued_job_needs() -> None:
    # nlp's job was submitted first, but vision's queued job needs its guaranteed 2 nodes
    queued = [_job(1, NLP, 3), _job(2, VISION, 2)]
    plan = schedule(replace(snap([GPU], nodes(1, 4, first_id=100), queued),
                            guarantees=_view()))
    assert set(placed(plan)) == {2}
    assert "guaranteed to team vision" in plan.pending[1], plan.pending
    small = [_job(1, NLP, 2), _job(2, VISION, 2)]
    plan = schedule(replace(snap([GPU], nodes(1, 4, first_id=100), small),
                            guarantees=_view()))
    assert set(placed(plan)) == {1, 2}  # 2 idle nodes beyond vision's need are lent


def test_the_borrow_limit_is_kept() -> None:
    s = replace(snap([GPU], nodes(1, 4, first_id=100), [_job(1, NLP, 3), _job(2, NLP, 1)]),
                guarantees=_view(limit=1))
    plan = schedule(s)
    assert set(placed(plan)) == {2}
    assert "borrow limit is 4 GPUs" in plan.pending[1], plan.pending[1]


def test_without_guarantees_nothing_changes() -> None:
    queued = [_job(1, NLP, 3), _job(2, VISION, 2)]
    plan = schedule(snap([GPU], nodes(1, 4, first_id=100), queued))
    assert set(placed(plan)) == {1} and plan.borrowed == {}


def test_reclaim_preempts_the_borrower_that_loses_least() -> None:
    running = [_run(10, NLP, (100,), started=0.0), _run(11, NLP, (101,), started=90.0),
               _run(12, NLP, (102, 103), started=50.0)]
    victims = reclaim(_view(), running, [_job(1, VISION, 1)], {}, set(), now=100.0)
    assert [(v.job_id, v.owner, v.team) for v in victims] == [(11, "vision", "nlp")]
    # two nodes: the one two-node job is fewer victims than two one-node jobs
    victims = reclaim(_view(), running, [_job(1, VISION, 2)], {}, set(), now=100.0)
    assert [v.job_id for v in victims] == [12]


def test_reclaim_counts_free_and_stopping_nodes_first() -> None:
    running = [_run(10, NLP, (100,)), _run(11, NLP, (101,)), _run(12, NLP, (102,))]
    assert reclaim(_view(), running, [_job(1, VISION, 1)], {1: 1}, set(), 5.0) == []
    assert reclaim(_view(), running, [_job(1, VISION, 1)], {}, {10}, 5.0) == []
    victims = reclaim(_view(), running, [_job(1, VISION, 2)], {}, {10}, 5.0)
    assert len(victims) == 1


def test_reclaim_uses_the_checkpoint_time_when_known() -> None:
    running = [_run(10, NLP, (100,), started=0.0), _run(11, NLP, (101,), started=90.0)]
    victims = reclaim(_view(), running, [_job(1, VISION, 1)], {}, set(), 100.0,
                      checkpoints={10: 99.0})
    assert [v.job_id for v in victims] == [10]
    # two nodes back: the two one-node jobs whose checkpoints are fresh, not the two-node
    # job that has run 60 s without one
    running = [_run(10, NLP, (100,), started=0.0), _run(11, NLP, (101,), started=0.0),
               _run(12, NLP, (102, 103), started=40.0)]
    victims = reclaim(_view(), running, [_job(1, VISION, 2)], {}, set(), 100.0,
                      checkpoints={10: 95.0, 11: 90.0})
    assert sorted(v.job_id for v in victims) == [10, 11]
    victims = reclaim(_view(), running, [_job(1, VISION, 2)], {}, set(), 100.0)
    assert [v.job_id for v in victims] == [12]  # no checkpoints: the youngest


def test_no_reclaim_beyond_the_owners_guarantee_or_from_teams_within_theirs() -> None:
    running = [_run(10, NLP, (100, 101)), _run(11, VISION, (102, 103))]
    # vision already uses its 2 nodes: a third is borrowing, not reclaiming
    assert reclaim(_view(), running, [_job(1, VISION, 1)], {}, set(), 5.0) == []
    # nlp within its own guarantee of 2 is never a victim
    both = _view(nlp=Guarantee(2))
    assert reclaim(both, [_run(10, NLP, (100, 101))], [_job(1, VISION, 2)], {}, set(),
                   5.0) == []
    assert len(reclaim(_view(), [_run(10, NLP, (100, 101))], [_job(1, VISION, 2)], {}, set(),
                       5.0)) == 1


def test_choose_takes_least_work_then_fewest_jobs() -> None:
    holders = [Holder(1, "a", 1, 5.0), Holder(2, "a", 1, 1.0), Holder(3, "a", 3, 50.0),
               Holder(4, "a", 2, 10.0)]
    assert [h.job_id for h in choose(holders, 1, {"a": 9}) or []] == [2]
    # two jobs losing 11 s between them, not one losing 50 s (issue 36 §2)
    assert sorted(h.job_id for h in choose(holders, 3, {"a": 9}) or []) == [2, 4]
    cheap = [Holder(3, "a", 3, 8.0), *holders[:2], holders[3]]
    assert [h.job_id for h in choose(cheap, 3, {"a": 9}) or []] == [3]
    tie = [Holder(5, "a", 2, 6.0), Holder(6, "a", 1, 3.0), Holder(7, "a", 1, 3.0)]
    assert [h.job_id for h in choose(tie, 2, {"a": 9}) or []] == [5]  # fewer jobs on a tie
    assert choose(holders, 8, {"a": 9}) is None
    assert choose(holders, 1, {"a": 0}) is None


def test_a_busy_cluster_is_not_reclaimed_for_a_job_that_cannot_fit_its_guarantee() -> None:
    s = replace(snap([GPU], busy_nodes(1, 4, first_id=100, job_id=10), [_job(1, VISION, 3)]),
                guarantees=_view())
    assert schedule(s).placements == []
    assert reclaim(_view(), [_run(10, NLP, (100, 101, 102, 103))], [_job(1, VISION, 3)],
                   {}, set(), 5.0) == []


def test_the_owners_job_is_told_which_jobs_give_its_nodes_back() -> None:
    running = [_run(10, NLP, (100,)), _run(11, NLP, (101,)), _run(12, NLP, (102,))]
    awaits: dict[int, tuple[int, ...]] = {}
    victims = reclaim(_view(), running, [_job(1, VISION, 1), _job(2, VISION, 1)], {1: 1},
                      {10}, 5.0, awaits=awaits)
    assert victims == [] and awaits == {2: (10,)}  # job 1 takes the idle node, 2 waits for 10
    awaits.clear()
    victims = reclaim(_view(), running, [_job(1, VISION, 2)], {}, {10}, 5.0, awaits=awaits)
    assert len(victims) == 1 and awaits == {1: (10, victims[0].job_id)}
    assert given_back_text("vision", ["b1"]) == (
        "waiting for team vision's guaranteed capacity: b1 on borrowed capacity is being "
        "preempted to give it back")
