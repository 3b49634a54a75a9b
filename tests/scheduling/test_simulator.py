"""The discrete-event simulator on hand-built cases: makespans and bubble ratios checked by hand."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from rhymerl.algorithms.scheduling import (
    EqualSplit,
    HistoPipe,
    LongestFirst,
    RooflineProfile,
    SpeculationSpeedup,
    TableProfile,
)
from rhymerl.algorithms.scheduling.costmodel import NO_SPECULATION
from rhymerl.api.scheduling import MigrationSpec
from rhymerl.tools.sim import SimConfig, simulate
from rhymerl.tools.sim.metrics import lower_bound
from rhymerl.tools.traces import Trace


def _cfg(workers: int, **kw: object) -> SimConfig:
    return SimConfig(workers=workers, profile=TableProfile.constant(1.0), **kw)


def test_an_idle_worker_waiting_for_the_slowest_is_a_bubble() -> None:
    r = simulate(Trace.from_steps([[("a", 4), ("b", 2)]]), EqualSplit(2, profile=TableProfile.constant()), _cfg(2))
    assert r.makespan == pytest.approx(4.0)
    assert r.busy == pytest.approx(6.0)
    assert r.bubble_ratio == pytest.approx(0.25)  # 2 idle worker-seconds of 8
    assert r.samples_per_s == pytest.approx(0.5)


def test_sequences_on_one_worker_decode_together_in_one_batch() -> None:
    r = simulate(Trace.from_steps([[("a", 3), ("b", 5)]]), EqualSplit(1), _cfg(1))
    assert r.makespan == pytest.approx(5.0)
    assert r.bubble_ratio == pytest.approx(0.0)
    assert r.mean_batch == pytest.approx((3 * 2 + 2 * 1) / 5)


def test_a_synchronous_step_waits_for_every_worker_before_the_next() -> None:
    tr = Trace.from_steps([[("a", 4), ("b", 2)], [("c", 2), ("d", 4)]])
    r = simulate(tr, EqualSplit(2), _cfg(2))
    assert r.makespan == pytest.approx(8.0)
    assert r.bubble_ratio == pytest.approx(1 - 12 / 16)
    assert [(s.start, s.end) for s in r.steps] == [(0.0, 4.0), (4.0, 8.0)]


def _alternating_trace() -> Trace:
    warm = [("s1", 2), ("l1", 4), ("s2", 2), ("l2", 4)]
    return Trace.from_steps([warm, [("s1", 2), ("l1", 4)], [("s2", 2), ("l2", 4)]])


def test_alternating_groups_fill_each_others_bubbles_across_two_steps() -> None:
    tr = _alternating_trace()
    sync = simulate(tr, EqualSplit(2), _cfg(2), warmup_steps=1)
    pipe = simulate(tr, HistoPipe(2, placement="per-worker", groups=2, two_tier=False), _cfg(2), warmup_steps=1)
    assert sync.makespan == pytest.approx(8.0)
    assert pipe.makespan == pytest.approx(6.0)  # each worker: one short and one long sample
    assert pipe.bubble_ratio == pytest.approx(0.0)
    assert pipe.rankings == {2: "history", 3: "history"}


def test_the_off_policy_bound_holds_the_pipeline_back() -> None:
    tr = _alternating_trace()
    on_policy = simulate(tr, HistoPipe(2, placement="per-worker", groups=2, two_tier=False, staleness=0), _cfg(2), warmup_steps=1)
    assert on_policy.makespan == pytest.approx(8.0)  # step 3 must wait for step 2 to train
    slow_train = simulate(tr, HistoPipe(2, placement="per-worker", groups=2, two_tier=False, staleness=0), _cfg(2, train_time_s=1.0),
                          warmup_steps=1)
    assert slow_train.makespan == pytest.approx(9.0)


def test_speculation_generates_several_tokens_per_pass() -> None:
    r = simulate(Trace.from_steps([[("a", 10)]]), EqualSplit(1), _cfg(1, speculation=SpeculationSpeedup(tokens_per_pass=2.0)))
    assert r.makespan == pytest.approx(5.0)


def test_admitting_a_batch_costs_its_prefill() -> None:
    cfg = SimConfig(workers=1, profile=TableProfile.constant(1.0, prefill_seconds_per_token=0.5))
    r = simulate(Trace.from_steps([[("a", 3), ("b", 3)]], input_len=2), EqualSplit(1), cfg)
    assert r.makespan == pytest.approx(2 * 2 * 0.5 + 3)


def test_an_outlier_migrates_off_a_short_groups_worker_with_its_tokens() -> None:
    warm = [("s", 10)] * 4 + [("l", 100)] * 4
    step = [("s", 10)] * 3 + [("s", 60)] + [("l", 100)] * 4
    tr = Trace.from_steps([warm, step, [("s", 10)] * 4 + [("l", 100)] * 4])
    mig = MigrationSpec(tail_fraction=0.25, min_lambda=1.1)
    cfg = SimConfig(workers=2, profile=TableProfile.constant(1.0, prefill_seconds_per_token=0.01))
    # no work stealing: an idle worker would take started samples too (recomputing them), not the subject here
    moved = simulate(tr, HistoPipe(2, placement="per-worker", groups=2, two_tier=False, migration=mig, work_stealing=False), cfg,
                     warmup_steps=1)
    kept = simulate(tr, HistoPipe(2, placement="per-worker", groups=2, two_tier=False, migration=MigrationSpec(enabled=False),
                                  work_stealing=False), cfg, warmup_steps=1)
    assert moved.intra_step == 1 and moved.migrated_samples == 1
    [(t, _, src, dst)] = moved.migrations
    assert t == pytest.approx(0.4 + 12) and src != dst  # after a 0.4 s prefill, at 12 tokens (> 1.1 x 10)
    assert moved.recompute_tokens == 10 + 12  # prompt + generated tokens prefilled again at the destination
    assert len(moved.finished) == len(kept.finished) == 16
    assert moved.makespan < kept.makespan


def test_the_default_roofline_simulates_a_thousand_sample_step() -> None:
    rows = [(f"p{i}", 200 + (i * 37) % 3000) for i in range(1024)]
    r = simulate(Trace.from_steps([rows]), EqualSplit(16, profile=RooflineProfile()), SimConfig(workers=16))
    assert len(r.finished) == 1024
    assert 0.0 <= r.bubble_ratio < 1.0
    assert r.makespan >= r.lower_bound.longest_sample


def test_a_step_may_start_only_within_the_off_policy_bound() -> None:
    pipe = HistoPipe(2, placement="per-worker", staleness=1)
    assert pipe.may_start(3, trained_through=1, completed_through=1)
    assert not pipe.may_start(4, trained_through=1, completed_through=3)  # would use weights 2 versions old
    sync = EqualSplit(2, staleness=1)
    assert not sync.may_start(3, trained_through=1, completed_through=1)  # barrier: step 2 still rolling out
    assert sync.may_start(3, trained_through=1, completed_through=2)


def test_each_step_reports_its_own_makespan_bubbles_and_throughput() -> None:
    tr = Trace.from_steps([[("a", 4), ("b", 2)], [("c", 2), ("d", 4)]])
    r = simulate(tr, EqualSplit(2), _cfg(2))
    first, second = r.steps
    assert (first.makespan, first.samples, first.samples_per_s) == (4.0, 2, 0.5)
    assert first.bubble_ratio == pytest.approx(0.25) and second.bubble_ratio == pytest.approx(0.25)
    assert first.migrations == 0


def test_the_bound_prices_work_at_the_even_split_batch_where_bigger_batches_are_cheaper_per_token() -> None:
    prof = RooflineProfile()
    lb = lower_bound(np.array([100, 300]), np.array([1000, 3000]), 2, 64, prof, NO_SPECULATION)
    decode = (1000 * prof.iteration_time(64, 600) + 3000 * prof.iteration_time(64, 1800)) / 64
    by_hand = decode + 400 * 2 * prof.params / (prof.peak_flops * prof.compute_efficiency)  # + both prompts' prefill
    assert lb.work_per_worker == pytest.approx(by_hand / 2)
    assert lb.longest_sample == pytest.approx(3000 * prof.iteration_time(1, 1800))


def test_the_bound_prices_work_at_a_smaller_batch_where_a_measured_profile_makes_it_cheaper() -> None:
    # one sequence: 1 s per token; four: 8 s per iteration, 2 s per token. Running batch 1 is
    # what a schedule would do here, and the bound must not be beaten by it.
    prof = TableProfile(batch_sizes=(1, 4), context_lens=(0, 100), seconds=((1.0, 1.0), (8.0, 8.0)),
                        prefill_seconds_per_token=0.0, max_batch=4)
    lb = lower_bound(np.array([0]), np.array([10]), 1, 4, prof, NO_SPECULATION)
    assert lb.work_per_worker == pytest.approx(10.0)


def _capped(capacity: int) -> TableProfile:
    return TableProfile(batch_sizes=(1, 2), context_lens=(0, 100), seconds=((1.0, 1.0), (1.0, 1.0)),
                        prefill_seconds_per_token=0.0, max_batch=8, kv_capacity_tokens=capacity)


def test_a_worker_admits_only_what_its_kv_cache_holds() -> None:
    # three 5-token responses to 10-token prompts, 30 tokens of cache: two fit (20 tokens, growing
    # 2 per iteration), the third waits for them to finish: 10 iterations instead of 5
    trace = Trace.from_steps([[("a", 5), ("b", 5), ("c", 5)]], input_len=10)
    prof = _capped(30)
    r = simulate(trace, EqualSplit(1, profile=prof), SimConfig(workers=1, profile=prof))
    assert r.makespan == pytest.approx(10.0)
    assert r.preemptions == 0 and r.peak_kv_tokens <= 30
    free = simulate(trace, EqualSplit(1, profile=prof), SimConfig(workers=1, profile=_capped(10_000)))
    assert free.makespan == pytest.approx(5.0)


def test_a_full_kv_cache_preempts_the_last_admitted_sequence_which_resumes_from_its_tokens() -> None:
    # two 20-token responses to 10-token prompts in 40 tokens of cache: both start (20 tokens), the
    # cache is full after 10 iterations; the second goes back to the queue with its 10 tokens, is
    # recomputed (prompt + 10 tokens) once the first ends at iteration 20, and ends 10 later
    trace = Trace.from_steps([[("a", 20), ("b", 20)]], input_len=10)
    prof = _capped(40)
    r = simulate(trace, EqualSplit(1, profile=prof), SimConfig(workers=1, profile=prof))
    assert r.preemptions == 1
    assert r.recompute_tokens == 20
    assert r.makespan == pytest.approx(30.0)
    assert len(r.finished) == 2


def test_the_sequence_admitted_last_is_preempted_whatever_its_trace_order() -> None:
    # LPT admits b (20 tokens) before a (15): when the 40-token cache fills after 10 iterations,
    # a goes back to the queue, b runs on to finish at 20 and a, resumed, at 25
    trace = Trace.from_steps([[("a", 15), ("b", 20)]], input_len=10)
    prof = _capped(40)
    r = simulate(trace, LongestFirst(1, profile=prof), SimConfig(workers=1, profile=prof))
    assert r.preemptions == 1
    assert r.finished[1][0] == pytest.approx(20.0)
    assert r.finished[0][0] == pytest.approx(25.0)


def test_the_simulators_modules_import_one_another_without_a_circle_and_only_the_top_imports_the_engine() -> None:
    package = Path(__file__).resolve().parents[2] / "rhymerl" / "tools" / "sim"
    imports: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        imports[path.stem] = {n.module for n in ast.walk(tree)
                              if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module is not None}
    assert {m for m, deps in imports.items() if "engine" in deps} == {"__init__", "elastic"}
    state: dict[str, str] = {}

    def visit(m: str) -> None:
        state[m] = "open"
        for d in imports.get(m, set()):
            assert state.get(d) != "open", f"import circle through {m} -> {d}"
            if d not in state:
                visit(d)
        state[m] = "done"

    for m in sorted(imports):
        if m not in state:
            visit(m)
