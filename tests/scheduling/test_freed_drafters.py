"""Drafters on freed workers: the pure decision and its prices (scheduling/freed_drafters.py), the
simulator carrying them out, and the per-step drafting report (sim/drafting.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rhymerl.algorithms.scheduling import EqualSplit, HistoPipe, RooflineProfile, TableProfile
from rhymerl.algorithms.scheduling.costmodel import verify_time
from rhymerl.algorithms.scheduling.freed_drafters import (
    DraftCosts,
    DrafterPlan,
    WorkerView,
    assign,
    consolidation,
    decide,
    drafted_pass_seconds,
    pays,
)
from rhymerl.cli.bench import bench_app
from rhymerl.tools.sim import SimConfig, SimulationError
from rhymerl.tools.sim.drafting import DraftSpan, step_drafting, tail_start
from rhymerl.tools.sim.elastic import ElasticFleet, FleetPlan
from rhymerl.tools.sim.engine import Simulator
from rhymerl.tools.sim.spot import PreemptionModel, Prices
from rhymerl.tools.traces import Trace

ONE = TableProfile.constant(1.0)


def _costs(**kw: object) -> DraftCosts:
    base: dict[str, object] = {"acceptance": 0.5, "window": 2, "message_s": 0.0,
                               "draft_profile": TableProfile.constant(0.1), "max_batch": 16}
    base.update(kw)
    return DraftCosts(**base)  # type: ignore[arg-type]


def test_tokens_per_pass_is_the_accepted_prefix_plus_the_targets_own_token() -> None:
    assert _costs(acceptance=0.5, window=2).tokens_per_pass == pytest.approx(1 + 0.5 + 0.25)
    assert _costs(acceptance=0.0, window=4).tokens_per_pass == pytest.approx(1.0)
    assert _costs(acceptance=0.714, window=4).tokens_per_pass == pytest.approx((1 - 0.714**5) / (1 - 0.714))


def test_verifying_k_tokens_under_the_roofline_reads_weights_and_kv_once_and_computes_every_position() -> None:
    prof = RooflineProfile()
    bw, flops = 3.35e12 * 0.8, 989e12 * 0.5
    mem = (7.6e9 * 2 + 2 * 1000 * 57_344) / bw
    compute = 2 * 7.6e9 * 2 * 5 / flops
    assert verify_time(prof, 2, 1000.0, 5) == pytest.approx(max(mem, compute) + 0.001)
    assert verify_time(prof, 3, 700.0, 1) == prof.iteration_time(3, 700.0)


def test_a_drafted_pass_takes_the_slower_of_verification_and_drafting_plus_the_message() -> None:
    assert drafted_pass_seconds(ONE, _costs(message_s=0.05), 1, 100.0) == pytest.approx(1.0 + 0.05)
    # the drafter needs 4 x 0.3 s for its window: the verifier waits for it
    assert drafted_pass_seconds(ONE, _costs(window=4, draft_profile=TableProfile.constant(0.3), message_s=0.05),
                                1, 100.0) == pytest.approx(1.2 + 0.05)


def test_drafting_pays_only_while_the_drafted_tokens_come_faster_than_plain_passes() -> None:
    assert pays(ONE, _costs(message_s=0.5), 1, 100.0)  # 1.75 tokens / 1.5 s > 1 token / 1 s
    assert not pays(ONE, _costs(message_s=1.0), 1, 100.0)  # 1.75 / 2.0 s < 1 / 1 s


def _view(w: int, running: int = 0, queued: int = 0, remaining: float = 0.0) -> WorkerView:
    return WorkerView(worker=w, running=running, queued=queued, context=100.0, remaining=remaining)


def test_freed_workers_draft_for_the_stragglers_with_the_most_to_go_first() -> None:
    views = [_view(2, 1, remaining=100), _view(3, 2, remaining=500), _view(4, 20, remaining=900),
             _view(5, 1, queued=1, remaining=800)]
    # 4 runs more than a drafter takes, 5 still has queued work: neither is drafted for
    assert assign(views, [0, 1], {}, ONE, _costs()) == {0: 3, 1: 2}
    assert assign(views, [0], {}, ONE, _costs()) == {0: 3}


def test_a_drafter_keeps_its_verifier_while_both_stay_eligible() -> None:
    views = [_view(2, 1, remaining=100), _view(3, 2, remaining=500)]
    assert assign(views, [0, 1], {1: 2}, ONE, _costs()) == {1: 2, 0: 3}
    # 2 finished its samples: its drafter is free for another straggler
    assert assign([_view(3, 2, remaining=500)], [0, 1, 2], {1: 2, 0: 3}, ONE, _costs()) == {0: 3}


def test_a_listed_worker_that_holds_samples_is_not_a_drafter() -> None:
    assert assign([_view(0, 1, remaining=10), _view(1, 1, remaining=20)], [0], {}, ONE, _costs()) == {}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 2), st.integers(0, 1000)), min_size=1, max_size=10),
    st.sets(st.integers(0, 11)),
    st.dictionaries(st.integers(0, 11), st.integers(0, 11), max_size=4),
    st.sampled_from([0.0, 0.5, 1.0]),
)
def test_every_assignment_uses_only_freed_workers_and_gives_a_straggler_at_most_one_drafter(
    loads: list[tuple[int, int, int]], freed: set[int], current: dict[int, int], message: float,
) -> None:
    views = [_view(w, r, q, rem) for w, (r, q, rem) in enumerate(loads)]
    costs = _costs(message_s=message, max_batch=8)
    out = assign(views, sorted(freed), current, ONE, costs)
    holding = {v.worker for v in views if v.running or v.queued}
    usable = freed - holding
    eligible = {v.worker for v in views if 1 <= v.running <= 8 and v.queued == 0 and v.worker not in usable
                and pays(ONE, costs, v.running, v.context)}
    assert set(out) <= usable  # never a worker that still has samples
    assert len(out) <= len(freed)
    assert len(set(out.values())) == len(out)  # a verifier (so each of its stragglers) has at most one drafter
    assert set(out.values()) <= eligible
    assert len(out) == min(len(usable), len(eligible))  # no freed worker idle while a straggler goes undrafted
    kept = {d: v for d, v in current.items() if d in usable and v in eligible}
    if len(set(kept.values())) == len(kept):
        assert all(out[d] == v for d, v in kept.items())


def _two_samples() -> Trace:
    return Trace.from_steps([[("a", 2), ("b", 10)]])


def _run(costs: DraftCosts | None) -> Simulator:
    sim = Simulator(_two_samples(), EqualSplit(2), SimConfig(workers=2, profile=ONE, freed_drafters=costs))
    sim.run()
    return sim


def test_a_worker_freed_by_a_short_sample_drafts_for_the_long_one() -> None:
    assert max(t for t, _, _ in _run(None).finished.values()) == pytest.approx(10.0)
    sim = _run(_costs())
    # a ends at 2 s, b has 8 tokens to go at 1.75 a pass: ceil(8 / 1.75) = 5 passes of 1 s
    assert sim.finished[1][0] == pytest.approx(7.0)
    assert sim.draft_spans == [DraftSpan(0, 1, 2.0, 7.0)]
    (step,) = sim.drafting_report()
    assert step.rollout_drafting_workers == 1
    assert step.tail_s == pytest.approx(5.0)
    assert step.tail_drafting_share == 1.0


def test_freed_drafters_are_refused_on_a_fleet_that_changes_while_it_runs() -> None:
    sim = Simulator(_two_samples(), EqualSplit(2), SimConfig(workers=2, profile=ONE, freed_drafters=_costs()))
    ElasticFleet(FleetPlan(gpus=2, spot=False), PreemptionModel(rate_per_gpu_h=0.0), Prices()).attach(sim)
    with pytest.raises(SimulationError, match="changes while it runs"):
        sim.run()


def test_a_slow_drafter_or_a_slow_message_stretches_every_drafted_pass() -> None:
    assert _run(_costs(draft_profile=TableProfile.constant(0.6))).finished[1][0] == pytest.approx(2.0 + 5 * 1.2)
    assert _run(_costs(message_s=0.5)).finished[1][0] == pytest.approx(2.0 + 5 * 1.5)
    unpaid = _run(_costs(message_s=1.0))  # 1.75 tokens per 2 s: slower than plain, so nobody drafts
    assert unpaid.finished[1][0] == pytest.approx(10.0)
    assert unpaid.draft_spans == []


@pytest.mark.parametrize("consolidate", [False, True])
def test_drafted_runs_finish_every_sample_once_with_all_its_tokens(consolidate: bool) -> None:
    steps = [[(f"p{i}", 5 + (7 * i * (s + 1)) % 40) for i in range(12)] for s in range(4)]
    sched = HistoPipe(3, groups=2)
    costs = _costs(consolidate=consolidate, max_batch=4)
    sim = Simulator(Trace.from_steps(steps), sched, SimConfig(workers=3, profile=ONE, freed_drafters=costs),
                    warmup_steps=1)
    sim.run()
    assert sorted(sim.finished) == sorted(sim.seqs)
    assert all(q.done and q.generated == q.target for q in sim.seqs.values())
    assert sim.draft_spans  # the shorter samples free workers in every step
    assert (sim.consolidations > 0) == consolidate


def test_a_straggler_without_a_drafter_moves_onto_another_when_the_merged_drafted_batch_ends_no_later() -> None:
    views = [_view(0, 1, remaining=40), _view(1, 1, remaining=100), _view(2, 1, remaining=60)]
    # nobody is freed: the least work (0) joins the most (1), which then ends in 100 / 1.75 passes of 1 s
    assert consolidation(views, {}, ONE, _costs()) == (0, 1)
    # a pass of 2 samples costs 3 s: merged, 1 would end at 100 / 1.75 x 3 = 171 s instead of 100 s
    steep = TableProfile(batch_sizes=(1, 2), context_lens=(0, 1_000_000), seconds=((1.0, 1.0), (3.0, 3.0)),
                         prefill_seconds_per_token=0.0, max_batch=16)
    assert consolidation(views, {}, steep, _costs()) is None
    # every straggling worker has a drafter: nothing to consolidate
    assert consolidation(views[:2], {5: 0, 6: 1}, ONE, _costs()) is None
    # 1.2124 tokens a pass: merged, 1 ends in 100 / 1.2124 = 82.5 s, short of the 20% margin below 100 s
    assert consolidation(views, {}, ONE, _costs(acceptance=0.18)) is None
    assert consolidation(views, {}, ONE, _costs(acceptance=0.18, consolidation_margin=1.0)) == (0, 1)


def test_the_decision_pairs_then_merges_once_and_the_emptied_worker_then_drafts_for_the_one_it_filled() -> None:
    views = [_view(0, 1, remaining=40), _view(1, 1, remaining=100), _view(2, 1, remaining=60)]
    costs = _costs(consolidate=True)
    assert decide(views, [], {}, ONE, costs) == DrafterPlan({}, (0, 1))  # as consolidation alone found above
    assert decide(views, [], {}, ONE, costs, may_merge=False) == DrafterPlan({}, None)  # a merge under way
    assert decide(views, [], {}, ONE, _costs()) == DrafterPlan({}, None)  # consolidation not asked for
    # the next event: 0 emptied onto 1 (2 samples there now), counted as drafting for it; 2 would end in
    # 60 s alone, merged onto 1 in max(60, 100) / 1.75 = 57 s: not within 80% of 60 s, so no second merge
    after = [_view(0), _view(1, 2, remaining=100), _view(2, 1, remaining=60)]
    assert decide(after, [0], {0: 1}, ONE, costs) == DrafterPlan({0: 1}, None)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(1, 120)), min_size=1,
                         max_size=5), min_size=1, max_size=6))
def test_an_event_sequence_gets_the_same_pairs_and_merges_from_the_decision_as_from_its_two_rules(
        events: list[list[tuple[int, int, int]]]) -> None:
    """What the fleet does after each event (pairs in force carried over, an emptied worker drafting
    for the one it filled) gives, through `decide`, what the simulator's glue of `assign` and
    `consolidation` gives."""
    costs = _costs(consolidate=True, max_batch=4)
    by_decide: dict[int, int] = {}
    by_rules: dict[int, int] = {}
    for loads in events:
        views = [_view(w, r, q, rem) for w, (r, q, rem) in enumerate(loads)]
        freed = [v.worker for v in views if not v.running and not v.queued]
        plan = decide(views, freed, by_decide, ONE, costs)
        pairs = assign(views, freed, by_rules, ONE, costs)
        merge = consolidation(views, pairs, ONE, costs)
        assert (plan.pairs, plan.merge) == (pairs, merge)
        by_decide = {**plan.pairs, **({plan.merge[0]: plan.merge[1]} if plan.merge else {})}
        by_rules = {**pairs, **({merge[0]: merge[1]} if merge else {})}


def test_two_lone_samples_share_one_worker_while_the_other_drafts_for_both() -> None:
    trace = Trace.from_steps([[("a", 10), ("b", 10)]])
    sim = Simulator(trace, EqualSplit(2), SimConfig(workers=2, profile=ONE, freed_drafters=_costs(consolidate=True)))
    sim.run()
    assert sim.consolidations == 1
    # both on worker 1 from the start, 1.75 tokens a pass of 1 s: ceil(10 / 1.75) = 6 passes
    assert sorted((t, w) for t, w, _ in sim.finished.values()) == [(6.0, 1), (6.0, 1)]
    assert sim.draft_spans == [DraftSpan(0, 1, 0.0, 6.0)]


def test_the_tail_starts_when_only_the_last_tenth_of_the_samples_is_left() -> None:
    assert tail_start([float(t) for t in range(1, 21)]) == 18.0  # 20 samples: the last 2 run from 18 s
    assert tail_start([5.0]) == 5.0


def test_drafting_workers_are_counted_at_their_peak_and_on_average_over_the_step() -> None:
    spans = [DraftSpan(0, 3, 1.0, 3.0), DraftSpan(1, 2, 2.0, 5.0), DraftSpan(0, 2, 12.0, 14.0)]
    (s,) = step_drafting(spans, {1: (0.0, 10.0)}, {1: [float(t) for t in range(1, 11)]})
    assert s.rollout_drafting_workers == 2
    assert s.drafting_workers_mean == pytest.approx((2.0 + 3.0) / 10.0)
    assert s.tail_s == pytest.approx(1.0)  # 10 samples: the last one, from 9 s to 10 s
    assert s.tail_drafting_share == 0.0


def test_the_bench_writes_a_row_per_point_and_the_drafting_count_per_step(tmp_path: Path) -> None:
    cli = typer.Typer()
    cli.add_typer(bench_app, name="bench")
    res = CliRunner().invoke(cli, ["bench", "drafters", "--trace", "synthetic:code", "--workers", "4", "--groups", "2",
                                   "--steps", "1", "--off-policy", "0", "--acceptance", "0.714", "--latency-ms", "1,20",
                                   "--out", str(tmp_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["latency_ms"], r["consolidate"]) for r in rows] == [(None, False), (1.0, False), (20.0, False),
                                                                   (1.0, True), (20.0, True)]
    assert all(len(r["per_step_drafting_workers"]) == 1 for r in rows)
    assert rows[0]["per_step_drafting_workers"] == [0]
    assert (tmp_path / "drafters.png").stat().st_size > 1000
    bad = CliRunner().invoke(cli, ["bench", "drafters", "--acceptance", "1.0"], env={"COLUMNS": "200"})
    assert bad.exit_code == 2 and "--acceptance" in bad.output
