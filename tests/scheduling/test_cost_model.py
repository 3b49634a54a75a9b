"""The profiled cost model: roofline defaults, measured tables, and decode-time estimates."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from rhymerl.algorithms.scheduling import (
    RooflineProfile,
    SpeculationSpeedup,
    TableProfile,
    group_decode_time,
    knee_batch,
    make_scheduler,
)
from rhymerl.algorithms.scheduling.costmodel import NO_SPECULATION, walk_decode_time, worker_decode_time
from rhymerl.api.scheduling import SchedulingSpec
from rhymerl.tools.sim import SimConfig, simulate
from rhymerl.tools.traces import Trace


def test_the_roofline_reads_all_weights_once_per_iteration() -> None:
    p = RooflineProfile()
    weights_s = 7.6e9 * 2 / (3.35e12 * 0.8)
    assert p.iteration_time(1, 0) == pytest.approx(weights_s + 0.001)
    kv_s = 64 * 4096 * 57_344 / (3.35e12 * 0.8)
    assert p.iteration_time(64, 4096) == pytest.approx(weights_s + kv_s + 0.001)
    assert p.iteration_times(np.array([1.0, 64.0]), np.array([0.0, 4096.0])) == pytest.approx(
        [p.iteration_time(1, 0), p.iteration_time(64, 4096)]
    )


def test_a_measured_table_is_exact_on_its_grid_and_bilinear_between() -> None:
    t = TableProfile(batch_sizes=(1, 3), context_lens=(0, 100), seconds=((1.0, 2.0), (3.0, 4.0)),
                     prefill_seconds_per_token=0.5, max_batch=8)
    assert t.iteration_time(1, 0) == 1.0 and t.iteration_time(3, 100) == 4.0
    assert t.iteration_time(2, 50) == pytest.approx(2.5)
    assert t.iteration_times(np.array([2.0]), np.array([50.0])) == pytest.approx([2.5])
    assert t.iteration_time(5, 100) == pytest.approx(6.0)  # linear beyond the grid: +1 s per sequence
    assert t.prefill_time(4) == 2.0


def test_a_shrinking_batch_is_priced_segment_by_segment() -> None:
    t = TableProfile(batch_sizes=(1, 2), context_lens=(0, 1000), seconds=((1.0, 1.0), (3.0, 3.0)),
                     prefill_seconds_per_token=0.0, max_batch=8)
    # lengths 2 and 5: 2 iterations with 2 running (3 s each), then 3 with 1 (1 s each)
    assert worker_decode_time(np.array([5.0, 2.0]), 0.0, t) == pytest.approx(2 * 3 + 3 * 1)


def test_beyond_max_batch_a_waiting_sequence_starts_when_a_running_one_finishes() -> None:
    t = TableProfile.constant(1.0, max_batch=2)
    # 5 and 3 start; at iteration 3 the 3 ends and the 2 starts, ending with the 5 at iteration 5
    assert worker_decode_time(np.array([2.0, 5.0, 3.0]), 0.0, t) == pytest.approx(5.0)
    assert worker_decode_time(np.array([4.0, 4.0, 4.0, 4.0]), 0.0, t) == pytest.approx(8.0)


def test_the_continuous_batching_walk_prices_a_full_batch_like_the_closed_form() -> None:
    p = RooflineProfile()
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 5000, size=40).astype(float)
    closed = worker_decode_time(lengths, 300.0, p)
    walked = walk_decode_time(np.sort(lengths)[::-1], 300.0, p, NO_SPECULATION)
    assert walked == pytest.approx(closed, rel=1e-9)


def test_the_context_of_a_batch_counts_each_sequence_from_its_own_admission() -> None:
    # an iteration costs its mean context in seconds; two slots. 4 and 2 start; the 2 ends at
    # iteration 2 and the other 2 starts. Iterations 0-2: mean context at mid-segment 1 -> 2 s;
    # iterations 2-4: the first sequence at 3 tokens, the new one at 1 (mid) -> mean 2 -> 4 s.
    t = TableProfile(batch_sizes=(1, 2), context_lens=(0, 10), seconds=((1e-12, 10.0), (1e-12, 10.0)),
                     prefill_seconds_per_token=0.0, max_batch=2)
    assert worker_decode_time(np.array([4.0, 2.0, 2.0]), 0.0, t) == pytest.approx(6.0)


def test_speculation_divides_iterations_by_tokens_per_pass_and_charges_the_pass_cost() -> None:
    p = TableProfile.constant(1.0)
    plain = worker_decode_time(np.array([100.0]), 0.0, p)
    fast = worker_decode_time(np.array([100.0]), 0.0, p, SpeculationSpeedup(tokens_per_pass=2.5, pass_cost=1.2))
    assert plain == pytest.approx(100.0)
    assert fast == pytest.approx(100 / 2.5 * 1.2)
    assert SpeculationSpeedup(tokens_per_pass=2.5).passes(100) == 40
    with pytest.raises(ValueError):
        SpeculationSpeedup(tokens_per_pass=0.5)


def test_a_group_finishes_with_its_slowest_worker_and_more_workers_never_hurt() -> None:
    lengths = np.array([100.0, 90.0, 50.0, 40.0, 10.0, 5.0])
    p = RooflineProfile()
    times = [group_decode_time(lengths, 100.0, n, p) for n in range(1, 8)]
    assert all(a >= b - 1e-12 for a, b in pairwise(times))
    assert times[-1] == pytest.approx(worker_decode_time(np.array([100.0]), 100.0, p))  # one sample per worker


def test_the_reallocation_threshold_is_the_knee_of_the_throughput_curve() -> None:
    p = RooflineProfile()
    k = knee_batch(p, 8192)
    best = p.max_batch / p.iteration_time(p.max_batch, 8192)
    assert k / p.iteration_time(k, 8192) >= 0.5 * best > (k - 1) / p.iteration_time(k - 1, 8192)
    assert 8 < k < 64


def test_the_estimate_preempts_like_the_simulator_when_the_kv_cache_is_full() -> None:
    # two 20-token responses to 10-token prompts in 40 tokens of cache (as in test_simulator):
    # the second is preempted after 10 iterations and ends 10 iterations after the first
    t = TableProfile(batch_sizes=(1, 2), context_lens=(0, 100), seconds=((1.0, 1.0), (1.0, 1.0)),
                     prefill_seconds_per_token=0.5, max_batch=8, kv_capacity_tokens=40)
    assert worker_decode_time(np.array([20.0, 20.0]), 10.0, t) == pytest.approx(30.0 + 0.5 * 20)


def test_tier_two_prices_a_worker_whose_kv_cache_fills_as_the_simulator_decodes_it() -> None:
    lengths = np.clip(np.random.default_rng(1).lognormal(8.7, 0.6, 300), 1, 16384).astype(int)
    trace = Trace.from_steps([[(f"p{i}", int(n)) for i, n in enumerate(lengths)]], input_len=100)
    p = RooflineProfile()
    r = simulate(trace, make_scheduler(SchedulingSpec(policy="lpt"), 1, profile=p), SimConfig(workers=1, profile=p))
    assert r.preemptions > 0
    estimate = worker_decode_time(lengths.astype(float), 100.0, p)
    assert estimate == pytest.approx(r.makespan - p.prefill_time(100) * 300, rel=0.01)


def test_tier_two_prices_a_worker_beyond_max_batch_as_the_simulator_decodes_it() -> None:
    lengths = np.clip(np.random.default_rng(1).lognormal(8, 0.6, 600), 1, 16384).astype(int)
    trace = Trace.from_steps([[(f"p{i}", int(n)) for i, n in enumerate(lengths)]], input_len=100)
    p = RooflineProfile()
    r = simulate(trace, make_scheduler(SchedulingSpec(policy="lpt"), 1, profile=p), SimConfig(workers=1, profile=p))
    assert r.preemptions == 0
    estimate = worker_decode_time(lengths.astype(float), 100.0, p)
    prefill = p.prefill_time(100) * 600  # the simulator charges admissions, the estimate does not
    assert estimate == pytest.approx(r.makespan - prefill, rel=0.01)
