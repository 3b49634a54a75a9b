"""Work stealing in HistoPipe's per-worker pipeline, and the steady-state / per-step bound figures.

Hand-checked with a constant profile (every iteration takes 1 s whatever the batch).
"""

from __future__ import annotations

import pytest

from rhymerl.algorithms.scheduling import HistoPipe, Move, Sample, SchedulingError, TableProfile
from rhymerl.algorithms.scheduling.factory import make_scheduler
from rhymerl.api.scheduling import MigrationSpec, SchedulingSpec
from rhymerl.tools.sim import SimConfig, simulate
from rhymerl.tools.traces import Trace

NO_MIGRATION = MigrationSpec(enabled=False)


def _trace() -> Trace:
    warm = [("a", 1), ("b", 10), ("c", 2), ("d", 1), ("d", 1), ("e", 1), ("f", 3)]
    return Trace.from_steps([warm, [("a", 1), ("b", 10)], [("c", 2), ("d", 1), ("d", 1)], [("e", 1), ("f", 3)]])


def _run(stealing: bool):  # type: ignore[no-untyped-def]
    sched = HistoPipe(2, placement="per-worker", groups=2, two_tier=False, migration=NO_MIGRATION, work_stealing=stealing,
                      profile=TableProfile.constant())
    return simulate(_trace(), sched, SimConfig(workers=2, profile=TableProfile.constant()), warmup_steps=1)


def test_an_idle_worker_takes_waiting_samples_of_its_step_from_a_busy_worker() -> None:
    # step 2 (even: descending): b on worker 0 (0-10), a on worker 1 (0-1). Step 3 (odd: ascending): both d
    # samples planned on worker 0, which is busy with b until 10; c on worker 1 (1-3). Step 4 may start only
    # when step 2 is done (off-policy 1), so without stealing worker 1 idles from 3 to 10 and worker 0 runs
    # the d samples at 10-11, then f (3 tokens, descending: worker 0) at 11-14.
    plain = _run(stealing=False)
    assert plain.makespan == pytest.approx(14.0)
    assert plain.stolen == 0
    # With stealing, worker 1 takes half of worker 0's waiting step-3 queue at 3 (one d: 3-4), then the
    # other half at 4 (4-5); worker 0 goes straight from b to f at 10: done at 13.
    steal = _run(stealing=True)
    assert steal.makespan == pytest.approx(13.0)
    assert steal.stolen == 2
    assert [(s.step, s.start, s.end) for s in steal.steps] == [(2, 0.0, 10.0), (3, 1.0, 5.0), (4, 10.0, 13.0)]
    assert {sid: w for sid, (_, w, _) in steal.finished.items() if steal.finished[sid][2] == 3} == {9: 1, 10: 1, 11: 1}  # ids are trace rows
    assert steal.migrated_samples == 0  # stealing is not a migration


def test_steady_state_and_per_step_bounds_are_reported() -> None:
    r = _run(stealing=True)
    # the bound's batch is the even split of the two steps off-policyness 1 releases, ceil(2 x 7 / 3 / 2) = 3:
    # a token costs 1 s / 3 of work
    assert [s.work_bound for s in r.steps] == pytest.approx([11 / 3 / 2, 4 / 3 / 2, 4 / 3 / 2])
    assert [s.longest_sample for s in r.steps] == pytest.approx([10.0, 2.0, 3.0])
    assert r.steps[0].bound == pytest.approx(10.0)
    # completions: step 3 at 5, step 2 at 10, step 4 at 13: (13 - 5) / 2 steps, against steps 2 and 4's work / N
    t, lb = r.steady_state()
    assert t == pytest.approx(4.0)
    assert lb == pytest.approx((11 / 6 + 4 / 6) / 2)
    assert r.steady_gap == pytest.approx(4.0 / 1.25 - 1.0)


# a pass costs in proportion to its batch (compute-bound decoding, as on a CPU): a smaller batch finishes sooner
LINEAR = TableProfile(batch_sizes=(1, 64), context_lens=(0, 100_000), seconds=((0.01, 0.01), (0.64, 0.64)),
                      prefill_seconds_per_token=0.0, max_batch=64)


def test_a_joining_worker_takes_half_of_the_busiest_workers_unfinished_samples_the_cheapest_first() -> None:
    sched = HistoPipe(1, placement="per-worker", groups=1, two_tier=False, migration=NO_MIGRATION, profile=LINEAR)
    plan = sched.plan_round(1, [Sample(i, "p", 10) for i in range(4)])
    assert plan.queues == [[0, 1, 2, 3]]
    joined = sched.add_worker()
    # worker 0: two unstarted samples and two started ones (3 and 9 tokens)
    offered = {0: [(0, 0), (1, 0), (2, 3), (3, 9)]}
    moves = sched.on_idle(joined, 1, offered)
    # half of 4, rounded up: the unstarted ones (the later queued first), nothing with tokens
    assert [(m.sid, m.src, m.dst, m.generated) for m in moves] == [(1, 0, 1, 0), (0, 0, 1, 0)]
    assert sched.stats.stolen == 0 and sched.outstanding(joined, 1) == 0  # requests: booked once confirmed
    sched.on_moved(moves, "steal")
    assert sched.stats.stolen == 2 and sched.outstanding(joined, 1) == 2 and sched.outstanding(0, 1) == 2
    assert not sched.stats.migrated_samples  # stealing is not a migration
    # with two started samples left, the one with fewer tokens moves, with its tokens
    assert [(m.sid, m.generated) for m in sched.on_idle(joined, 1, {0: [(2, 3), (3, 9)]})] == [(2, 3)]
    # a worker running its last started sample keeps it
    assert sched.on_idle(joined, 1, {0: [(3, 9)]}) == []


def test_started_samples_move_only_where_a_smaller_batch_finishes_sooner() -> None:
    flat = HistoPipe(1, placement="per-worker", groups=1, two_tier=False, migration=NO_MIGRATION, profile=TableProfile.constant(0.01))
    linear = HistoPipe(1, placement="per-worker", groups=1, two_tier=False, migration=NO_MIGRATION, profile=LINEAR)
    for sched in (flat, linear):
        sched.plan_round(1, [Sample(i, "p", 10) for i in range(4)])
        sched.add_worker()
    running = {0: [(0, 5), (1, 6), (2, 7), (3, 8)]}
    # memory-bound: four in a pass cost what one does; splitting them only adds the recompute
    assert flat.on_idle(1, 1, running) == []
    assert [m.sid for m in linear.on_idle(1, 1, running)] == [0, 1]
    # unstarted samples cost no recompute: they move whatever the profile
    assert [m.sid for m in flat.on_idle(1, 1, {0: [(0, 0), (1, 0), (2, 7)]})] == [1, 0]


def test_the_scheduler_refuses_to_steal_a_sample_it_was_not_offered() -> None:
    sched = HistoPipe(2, placement="per-worker", groups=2, two_tier=False, migration=NO_MIGRATION)
    plan = sched.plan_round(1, [Sample(0, "p", 10), Sample(1, "q", 10), Sample(2, "q", 10)])
    busy = next(w for w in range(2) if len(plan.queues[w]) == 2)
    idle = 1 - busy

    class Greedy(HistoPipe):
        def _steal(self, worker, step, unfinished):  # type: ignore[no-untyped-def]
            return [Move(sid=sid, src=busy, dst=worker, generated=0) for sid in plan.queues[busy]]

    greedy = Greedy(2, groups=2, two_tier=False, migration=NO_MIGRATION)
    greedy.plan_round(1, [Sample(0, "p", 10), Sample(1, "q", 10), Sample(2, "q", 10)])
    with pytest.raises(SchedulingError):  # only one of the two was offered
        greedy.on_idle(idle, 1, {busy: [(plan.queues[busy][1], 0)]})
    assert sched.on_idle(idle, 1, {}) == []
    assert HistoPipe(2, placement="per-worker", work_stealing=False).on_idle(0, 1, {1: [(5, 0), (6, 0)]}) == []


def test_the_jobs_work_stealing_switch_reaches_the_scheduler() -> None:
    on, off = make_scheduler(SchedulingSpec(), 2), make_scheduler(SchedulingSpec(work_stealing=False), 2)
    assert isinstance(on, HistoPipe) and isinstance(off, HistoPipe)
    assert on.work_stealing and not off.work_stealing
