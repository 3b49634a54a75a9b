"""Migration-based rebalancing (RhymeRL §6.3): thresholds, lambda, destinations, preserved tokens."""

from __future__ import annotations

import pytest

from rhymerl.algorithms.scheduling import (
    HistoPipe,
    LengthHistory,
    Move,
    Sample,
    SchedulingError,
    Watch,
)
from rhymerl.algorithms.scheduling import migration as mig
from rhymerl.api.scheduling import MigrationSpec


def test_the_tail_is_the_last_fraction_of_a_group_and_at_least_one_sample() -> None:
    assert mig.tail_size(128, 0.1) == 13
    assert mig.tail_size(5, 0.1) == 1
    assert mig.tail_size(100, 0.0) == 0
    assert mig.in_tail(13, 128, 0.1) and not mig.in_tail(14, 128, 0.1)
    assert not mig.in_tail(0, 128, 0.1)


def test_an_outlier_must_exceed_lambda_times_the_groups_longest_history() -> None:
    assert mig.threshold_tokens(1.1, 1000) == 1101
    assert mig.threshold_tokens(1.25, 800) == 1001


def test_lambda_is_the_75th_percentile_of_last_epochs_growth_and_at_least_the_floor() -> None:
    h = LengthHistory()
    assert h.growth_lambda(75, 1.1) == 1.1  # no growth observed yet
    for i, g in enumerate([1.0, 1.2, 1.4, 1.6, 1.8]):
        h.observe(f"p{i}", [100, 100, 100])
        h.observe(f"p{i}", [round(100 * g)] * 3)
    assert h.growth_lambda(75, 1.1) == pytest.approx(1.6)
    shrinking = LengthHistory()
    shrinking.observe("p", [100])
    shrinking.observe("p", [90])
    assert shrinking.growth_lambda(75, 1.1) == 1.1


def test_short_groups_migrate_within_the_step_to_the_longest_running_group() -> None:
    cands = [mig.Candidate(worker=1, group_rank=2, outstanding=5), mig.Candidate(worker=2, group_rank=3, outstanding=9),
             mig.Candidate(worker=3, group_rank=3, outstanding=4)]
    d = mig.decide(src_worker=0, src_rank=0, groups=4, candidates=cands, inter_step_allowed=True)
    assert d == mig.Decision("intra-step", 3)  # longest group, least loaded worker


def test_long_groups_defer_to_the_next_step_and_fall_back_to_intra_step() -> None:
    cands = [mig.Candidate(worker=1, group_rank=1, outstanding=5)]
    assert mig.decide(0, 3, 4, cands, inter_step_allowed=True).kind == "inter-step"
    assert mig.decide(0, 3, 4, cands, inter_step_allowed=False) == mig.Decision("intra-step", 1)
    assert mig.decide(0, 3, 4, [], inter_step_allowed=False).kind == "stay"
    assert mig.decide(1, 0, 4, cands, inter_step_allowed=False).kind == "stay"  # never to itself


def _two_group_scheduler(inter_step: bool = True) -> tuple[HistoPipe, list[Sample]]:
    """4 workers, 2 ranking groups of 2 prompts x 5 samples; history: short prompts 100, long 1000 tokens."""
    sched = HistoPipe(4, placement="per-worker", groups=2, two_tier=False,
                      migration=MigrationSpec(tail_fraction=0.2, min_lambda=1.1, inter_step=inter_step))
    for p, n in (("s0", 100), ("s1", 100), ("l0", 1000), ("l1", 1000)):
        sched.prime(p, [n] * 5)
    samples = [Sample(sid=10 * i + j, prompt_id=p, input_len=8) for i, p in enumerate(("s0", "s1", "l0", "l1"))
               for j in range(5)]
    return sched, samples


def _worker_of(plan_queues: list[list[int]], sid: int) -> int:
    return next(w for w, q in enumerate(plan_queues) if sid in q)


def test_a_short_groups_tail_is_watched_and_its_outlier_moves_with_its_tokens() -> None:
    sched, samples = _two_group_scheduler()
    plan = sched.plan_round(1, samples)
    short = [s.sid for s in samples if s.prompt_id.startswith("s")]
    actions = []
    for sid in short[:8]:  # 8 of 10 done: the last 2 (20%) are the tail
        actions += sched.on_sample_finished(sid, _worker_of(plan.queues, sid), 100, now=1.0)
    watches = [a for a in actions if isinstance(a, Watch)]
    assert {w.sid for w in watches} == set(short[8:])
    assert {w.tokens for w in watches} == {111}  # lambda 1.1 x longest history 100, strictly more
    straggler = short[9]
    src = _worker_of(plan.queues, straggler)
    assert sched.on_progress(straggler, src, 110, now=2.0) == []  # not beyond the threshold yet
    before = {w: sched.outstanding(w, 1) for w in range(4)}
    [move] = sched.on_progress(straggler, src, 111, now=2.0)
    assert isinstance(move, Move) and move.kind == "intra-step" and move.generated == 111
    assert move.dst in {w for w, q in enumerate(plan.queues) if q and q[0] // 10 >= 2}  # a long group's worker
    assert sched.outstanding(src, 1) == before[src] - 1
    assert sched.outstanding(move.dst, 1) == before[move.dst] + 1
    assert sched.on_progress(straggler, move.dst, 500, now=3.0) == []  # a sample migrates at most once
    sched.on_sample_finished(straggler, move.dst, 600, now=4.0)
    assert sched.stats.intra_step == 1 and straggler in sched.stats.migrated_samples


def test_a_long_groups_outlier_joins_the_next_plan_with_its_generated_tokens() -> None:
    sched, samples = _two_group_scheduler()
    plan = sched.plan_round(1, samples)
    long_ids = [s.sid for s in samples if s.prompt_id.startswith("l")]
    for sid in long_ids[:8]:
        sched.on_sample_finished(sid, _worker_of(plan.queues, sid), 1000, now=1.0)
    outlier = long_ids[8]
    [move] = sched.on_progress(outlier, _worker_of(plan.queues, outlier), 1101, now=2.0)
    assert move.kind == "inter-step" and move.dst is None and move.generated == 1101
    assert sched.deferred() == [outlier]
    assert sched.round_left(1) == 10 + 1  # 20 planned, 8 finished, 1 deferred
    with pytest.raises(SchedulingError, match="deferred"):
        sched.on_sample_finished(outlier, 0, 1500, now=2.5)
    nxt = sched.plan_round(2, [Sample(sid=100 + i, prompt_id="s0", input_len=8) for i in range(3)])
    assert nxt.carried == [outlier] and outlier in nxt.all_samples()
    assert sched.deferred() == []
    w = _worker_of(nxt.queues, outlier)
    sched.on_sample_finished(outlier, w, 1500, now=3.0)
    with pytest.raises(SchedulingError, match="finished twice"):
        sched.on_sample_finished(outlier, w, 1500, now=3.1)


def test_the_last_step_never_defers_to_a_step_that_will_not_come() -> None:
    sched, samples = _two_group_scheduler()
    sched.final_round = 1
    plan = sched.plan_round(1, samples)
    long_ids = [s.sid for s in samples if s.prompt_id.startswith("l")]
    for sid in long_ids[:8]:
        sched.on_sample_finished(sid, _worker_of(plan.queues, sid), 1000, now=1.0)
    outlier = long_ids[8]
    [move] = sched.on_progress(outlier, _worker_of(plan.queues, outlier), 2000, now=2.0)
    assert move.kind == "intra-step"  # falls back to a worker still running this step


def test_groups_without_history_are_never_migrated() -> None:
    sched = HistoPipe(2, placement="per-worker", groups=2)
    plan = sched.plan_round(1, [Sample(sid=i, prompt_id=f"p{i}", input_len=1) for i in range(4)])
    actions = []
    for sid in range(3):
        actions += sched.on_sample_finished(sid, _worker_of(plan.queues, sid), 5, now=1.0)
    assert actions == []


def _books(sched: HistoPipe, step: int) -> tuple[list[int], int, list[int], int, int]:
    return ([sched.outstanding(w, step) for w in range(4)], sched.round_left(step), sched.deferred(),
            sched.stats.intra_step, sched.stats.inter_step)


def test_a_move_that_could_not_happen_leaves_the_books_as_before_it_and_the_sample_finishes_where_it_was() -> None:
    sched, samples = _two_group_scheduler()
    plan = sched.plan_round(1, samples)
    short = [s.sid for s in samples if s.prompt_id.startswith("s")]
    long_ids = [s.sid for s in samples if s.prompt_id.startswith("l")]
    for sid in short[:8] + long_ids[:8]:
        sched.on_sample_finished(sid, _worker_of(plan.queues, sid), 100, now=1.0)
    for outlier, generated, kind in ((short[9], 111, "intra-step"), (long_ids[9], 1101, "inter-step")):
        src = _worker_of(plan.queues, outlier)
        before = _books(sched, 1)
        [move] = sched.on_progress(outlier, src, generated, now=2.0)
        assert isinstance(move, Move) and move.kind == kind
        assert _books(sched, 1) != before
        sched.on_move_failed(move)  # the executor found it finished at src first
        assert _books(sched, 1) == before
        assert outlier not in sched.stats.migrated_samples
        assert sched.on_progress(outlier, src, generated + 500, now=3.0) == []  # not chosen again
        sched.on_sample_finished(outlier, src, generated + 1, now=4.0)
    with pytest.raises(SchedulingError, match="cannot be undone"):
        sched.on_move_failed(move)
    nxt = sched.plan_round(2, [Sample(sid=100, prompt_id="s0", input_len=8)])
    assert nxt.carried == []  # the failed deferral does not reappear
