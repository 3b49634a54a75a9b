"""Multi-turn samples in the simulator: a turn ends, the sample leaves its worker for its tool call
(holding no slot, its KV cache dropped), comes back with its tokens and decodes the next turn."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rhymerl.algorithms.scheduling import AsyncRollout, EqualSplit, TableProfile
from rhymerl.tools.sim import SimConfig, simulate
from rhymerl.tools.sim.metrics import lower_bound, reentry_tokens
from rhymerl.tools.traces import Trace, synthetic
from rhymerl.tools.traces.model import Turns


def _trace(steps: list[list[tuple[str, int, list[tuple[int, float]]]]], input_len: int = 10) -> Trace:
    """steps[i]: (prompt_id, output_len, turns) of step i + 1's responses."""
    rows = [(i, p, n, t) for i, step in enumerate(steps, start=1) for p, n, t in step]
    return Trace.build("hand-made", [r[0] for r in rows], [r[1] for r in rows], [input_len] * len(rows),
                       [r[2] for r in rows], turns=Turns.of([r[3] for r in rows]))


def test_a_tool_call_adds_its_latency_and_a_prefill_of_the_context_so_far() -> None:
    tr = _trace([[("a", 7, [(3, 2.5), (4, 0.0)])]])
    cfg = SimConfig(workers=1, profile=TableProfile.constant(1.0, prefill_seconds_per_token=0.5))
    r = simulate(tr, EqualSplit(1), cfg)
    # prefill 10 tokens (5 s), 3 iterations, tool 2.5 s, prefill 10 + 3 tokens (6.5 s), 4 iterations
    assert r.makespan == pytest.approx(5 + 3 + 2.5 + 6.5 + 4)
    assert r.recompute_tokens == 13
    assert r.busy == pytest.approx(5 + 3 + 6.5 + 4)


def test_a_sample_at_its_tool_frees_its_slot_for_another() -> None:
    tr = _trace([[("a", 4, [(2, 4.0), (2, 0.0)]), ("b", 3, [(3, 0.0)])]])
    r = simulate(tr, AsyncRollout(1), SimConfig(workers=1, profile=TableProfile.constant(1.0), async_concurrency=1))
    # a decodes 0..2 and leaves; b takes the slot 2..5; the worker idles until a is back at 6; a ends at 8
    assert r.makespan == pytest.approx(8.0)
    assert r.busy == pytest.approx(7.0)
    assert sorted(t for t, _, _ in r.finished.values()) == pytest.approx([5.0, 8.0])


def test_a_per_worker_sample_comes_back_to_its_own_worker() -> None:
    tr = _trace([[("a", 4, [(2, 1.5), (2, 0.0)]), ("b", 10, [(10, 0.0)])]])
    r = simulate(tr, EqualSplit(2), SimConfig(workers=2, profile=TableProfile.constant(1.0)))
    a, b = (next(i for i in range(len(tr)) if tr.prompt_id[i] == p) for p in ("a", "b"))
    assert r.finished[a][0] == pytest.approx(2 + 1.5 + 2)
    assert r.finished[b][0] == pytest.approx(10.0)
    assert r.finished[a][1] != r.finished[b][1]  # not the other worker's queue, though it is busy longer


def test_a_trace_of_single_turns_simulates_exactly_as_one_without_turns() -> None:
    plain = synthetic("search-agent", max_turns=1, steps=3)
    single = dataclasses.replace(plain, turns=Turns.of([[(int(n), 0.0)] for n in plain.output_len.tolist()]))
    for make in (lambda: EqualSplit(4), lambda: AsyncRollout(4)):
        a = simulate(plain, make(), SimConfig(workers=4))
        b = simulate(single, make(), SimConfig(workers=4))
        assert (a.makespan, a.segments, a.finished, a.recompute_tokens) == (b.makespan, b.segments, b.finished,
                                                                           b.recompute_tokens)


def test_the_lower_bound_waits_for_the_tool_calls_and_prefills_each_later_turn() -> None:
    turns = Turns.of([[(3, 4.0), (4, 0.0)], [(2, 0.0)]])
    profile = TableProfile.constant(1.0, prefill_seconds_per_token=0.5)
    inputs, outputs = np.array([10, 20]), np.array([7, 2])
    spec = SimConfig(workers=1).speculation
    plain = lower_bound(inputs, outputs, 1, 2, profile, spec)
    lb = lower_bound(inputs, outputs, 1, 2, profile, spec, turns)
    assert reentry_tokens(inputs, turns) == 13
    assert lb.work_per_worker == pytest.approx(plain.work_per_worker + 13 * 0.5)
    assert lb.longest_sample == pytest.approx(7 + 4.0)


def test_turns_follow_their_rows_when_a_trace_is_sorted_by_step() -> None:
    tr = Trace.build("t", [2, 1, 2], ["x", "y", "z"], [1, 1, 1], [5, 3, 4],
                     turns=Turns.of([[(2, 1.0), (3, 0.0)], [(3, 0.0)], [(1, 2.0), (3, 9.0)]]))
    assert [tr.prompt_id[i] for i in range(3)] == ["y", "x", "z"]
    assert tr.turns is not None
    assert [tr.turns.of_row(i) for i in range(3)] == [([3], [0.0]), ([2, 3], [1.0, 0.0]), ([1, 3], [2.0, 0.0])]
    with pytest.raises(ValueError, match="summing to the row's output_len"):
        Trace.build("t", [1], ["x"], [1], [6], turns=Turns.of([[(2, 1.0), (3, 0.0)]]))


def test_the_search_agent_preset_splits_the_same_lengths_into_turns_with_tool_calls() -> None:
    multi, single = synthetic("search-agent", steps=4), synthetic("search-agent", steps=4, max_turns=1)
    assert single.turns is None and multi.turns is not None
    assert np.array_equal(multi.output_len, single.output_len)
    assert np.array_equal(multi.turns.totals(), multi.output_len)
    count = multi.turns.count()
    assert np.array_equal(count, np.clip(-(-multi.output_len // 500), 1, 3))
    assert np.all(multi.turns.tokens <= 500)
    assert np.array_equal(multi.turns.tool_seconds() > 0, count > 1)
