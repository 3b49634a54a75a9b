"""HistoPipe's default placement: one queue across steps in the ranking's order, dealt round-robin."""

from __future__ import annotations

import pytest

from rhymerl.algorithms.scheduling import HistoPipe, TableProfile, make_scheduler
from rhymerl.algorithms.scheduling.baselines import AsyncRollout
from rhymerl.algorithms.scheduling.types import Sample
from rhymerl.api.scheduling import SchedulingSpec
from rhymerl.tools.sim import SimConfig, simulate
from rhymerl.tools.traces import Trace


def test_the_default_scheduler_is_histopipe_on_a_shared_queue_that_fills_the_engines_batch() -> None:
    default = make_scheduler(SchedulingSpec(), 2)
    assert isinstance(default, HistoPipe) and default.label == "histopipe (shared)"
    assert (default.pipeline, default.fills_batch, default.interrupt_on_update) == ("shared", True, False)
    paper = make_scheduler(SchedulingSpec(), 2, placement="per-worker")
    assert (paper.pipeline, paper.fills_batch, paper.label) == ("per-worker", False, "histopipe (2-tier)")


def test_an_unknown_placement_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="placement: 'spread'"):
        HistoPipe(2, placement="spread")  # type: ignore[arg-type]


def test_with_history_the_shared_queue_holds_the_predicted_longest_first() -> None:
    sched = HistoPipe(2, groups=2)
    sched.prime("short", [10, 30])
    sched.prime("long", [200, 400])
    samples = [Sample(0, "short", 5), Sample(1, "short", 5), Sample(2, "long", 5), Sample(3, "long", 5)]
    plan = sched.plan_round(1, samples)
    assert plan.queues == [] and plan.ranking == "history"
    assert plan.shared == [2, 3, 0, 1]  # medians 300 and 20


def test_without_history_every_sample_is_queued_once_in_the_groups_order() -> None:
    sched = HistoPipe(2, groups=2, spread_groups=False)
    samples = [Sample(0, "p", 50), Sample(1, "p", 50), Sample(2, "q", 500), Sample(3, "q", 500)]
    plan = sched.plan_round(1, samples)
    assert plan.ranking == "prompt-length" and sorted(plan.shared) == [0, 1, 2, 3]
    assert plan.shared == [0, 1, 2, 3]  # ascending groups on an odd step: the shorter prompt's group first


def test_without_history_the_queue_takes_every_prompts_first_sample_then_every_ones_second() -> None:
    samples = [Sample(k + 3 * i, p, n) for i, (p, n) in enumerate([("p", 50), ("q", 500), ("r", 90)]) for k in range(3)]
    plan = HistoPipe(2, groups=3).plan_round(1, samples)
    # the groups' order p, r, q for the first samples, turned by one prompt for each next rank
    assert plan.shared == [0, 6, 3, 7, 4, 1, 5, 2, 8]


def test_spread_siblings_are_dealt_over_every_worker_not_a_group_to_one() -> None:
    samples = [Sample(4 * i + k, p, 50) for i, p in enumerate("ab") for k in range(4)]
    shared = HistoPipe(2, groups=1).plan_round(1, samples).shared
    dealt = {sid: j % 2 for j, sid in enumerate(shared)}  # as the fleet deals a shared queue
    assert [sorted(dealt[4 * i + k] for k in range(4)) for i in range(2)] == [[0, 0, 1, 1], [0, 0, 1, 1]]
    assert [sid % 4 for sid in shared] == [0, 0, 1, 1, 2, 2, 3, 3]  # and each worker's share sibling by sibling


def test_with_history_spreading_leaves_the_predicted_longest_first() -> None:
    sched = HistoPipe(2, groups=2)
    sched.prime("short", [10, 30])
    sched.prime("long", [200, 400])
    samples = [Sample(0, "short", 5), Sample(1, "short", 5), Sample(2, "long", 5), Sample(3, "long", 5)]
    assert sched.plan_round(1, samples).shared == [2, 3, 0, 1]


def _ranked_trace() -> Trace:
    step = [("a", 4), ("b", 3), ("c", 2), ("d", 1)]
    return Trace.from_steps([step, step])


def test_the_shared_queue_is_dealt_round_robin_so_the_longest_samples_spread_over_the_workers() -> None:
    cfg = SimConfig(workers=2, profile=TableProfile.constant(1.0))
    r = simulate(_ranked_trace(), HistoPipe(2, groups=1, profile=cfg.profile), cfg, warmup_steps=1)
    # queue a(4) b(3) c(2) d(1): worker 0 takes a and c, worker 1 b and d; one pass a second
    assert {sid: w for sid, (_, w, _) in r.finished.items()} == {4: 0, 5: 1, 6: 0, 7: 1}
    assert [r.finished[sid][0] for sid in (4, 5, 6, 7)] == pytest.approx([4.0, 3.0, 2.0, 1.0])
    assert r.makespan == pytest.approx(4.0)


@pytest.mark.parametrize(("staleness", "batch"), [(0, 2), (1, 4)])
def test_the_lower_bound_prices_work_at_the_even_split_of_the_steps_the_off_policy_bound_releases(
        staleness: int, batch: int) -> None:
    cfg = SimConfig(workers=2, profile=TableProfile.constant(1.0))
    r = simulate(_ranked_trace(), AsyncRollout(2, profile=cfg.profile, staleness=staleness), cfg, warmup_steps=1)
    assert r.lower_bound.batch == batch  # 4 samples a step on 2 workers, 1 + staleness steps at once
