"""The verify-cost profile corrects itself: per-cell bounds from real passes, the overhead priced
against the corrected cells, corrections cached, cells shown stale or disturbed measured again."""

from __future__ import annotations

import io
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jobs import make_job
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, TextColumn

from rhymerl.algorithms.drafting.adaptive_cap import (
    AcceptanceTracker,
    CostEvidence,
    CostProfile,
    profile_cells,
)
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.cli.local_run import profile_reporter
from rhymerl.workers.history.store import MemoryHistoryStore
from rhymerl.workers.model.transformer import ModelConfig, TinyLlama
from rhymerl.workers.rollout import verify_cost
from rhymerl.workers.rollout.speculation import RolloutSpeculation
from rhymerl.workers.rollout.speculators import DraftCapController
from rhymerl.workers.rollout.verify_cost import (
    MAX_AGE_S,
    CacheEntry,
    ProfileStore,
    cell_tokens,
    estimated_bounds,
)

GRID = dict(context=8, batches=(1, 2), tokens=(1, 2))  # 2 x (2 + verify) = 6 cells on the tiny model


def _profile(scale: float = 1.0) -> CostProfile:
    # true costs in ms: batch 1 appends 1 or 2 tokens for 2 or 3 ms, batch 4 for 4 or 6; verify 2.5 / 5
    return CostProfile((1, 4), (1, 2), ((0.002 * scale, 0.003 * scale), (0.004 * scale, 0.006 * scale)),
                       (0.0025 * scale, 0.005 * scale))


def test_a_cell_is_lowered_to_a_pass_seen_at_or_above_it() -> None:
    ev = CostEvidence(_profile(1.5), confirm=1)  # cells 1.5x too slow: 3, 4.5 / 6, 9 ms; verify 3.75 / 7.5
    assert ev.observe(4, 1.0, 0.0045)  # a plain pass over 4 sequences took 4.5 ms, overheads included
    # both batch rows' 1-token cells are bounded by it (batch 1's 3 ms already lies below); the
    # 2-token column and the verify path are not
    assert _grid(ev.profile) == pytest.approx([0.003, 0.0045, 0.0045, 0.009])
    assert ev.profile.verify_one == pytest.approx((0.00375, 0.0075))
    assert ev.observe(4, 1.5, 0.007)  # a pass with drafts: 1.5 tokens per sequence, on the verify path
    assert ev.profile.verify_one == pytest.approx((0.00375, 0.007))
    assert _grid(ev.profile) == pytest.approx([0.003, 0.0045, 0.0045, 0.009])  # 2 tokens per sequence: not reached
    assert ev.observe(2, 2.0, 0.004)  # batch 2 bounds the batch-1 row only
    assert _grid(ev.profile) == pytest.approx([0.003, 0.004, 0.0045, 0.009])


def test_once_passes_show_the_measurement_disturbed_every_cell_follows_the_disturbance() -> None:
    ev = CostEvidence(_profile(10.0), confirm=1)
    assert ev.observe(4, 1.0, 0.005)
    # the 1-token cells came out at 5/20 and 5/40 of the measurement: disturbed. Every cell takes
    # the median ratio, 0.1875, or its own bound where lower (batch 4, 1 token: 5 ms < 7.5 ms),
    # instead of pricing drafts and the cells passes bound loosely 10x too high meanwhile
    assert _grid(ev.profile) == pytest.approx([0.02 * 0.1875, 0.03 * 0.1875, 0.005, 0.06 * 0.1875])
    assert ev.profile.verify_one == pytest.approx((0.025 * 0.1875, 0.05 * 0.1875))
    one = CostEvidence(_profile(10.0), confirm=1)
    one.observe(1, 1.0, 0.005)  # a single disturbed cell is not yet a disturbed measurement
    assert _grid(one.profile) == pytest.approx([0.005, 0.03, 0.04, 0.06])


def test_small_cells_a_big_pass_bounds_loosely_do_not_outvote_the_disturbance_it_shows() -> None:
    # measured 10x too slow: batch 1 (10, 12 ms; verify 10), batch 4 (11, 13; 11), batch 64 (100, 140; 120)
    ev = CostEvidence(CostProfile((1, 4, 64), (1, 2), ((0.010, 0.012), (0.011, 0.013), (0.100, 0.140)),
                                  (0.010, 0.011, 0.120)), confirm=1)
    assert ev.observe(64, 2.0, 0.016)  # bounds all nine cells; the six small ones lie below 16 ms anyway
    # the three batch-64 cells are disturbed; the median ratio 16/120 applies to every cell (or
    # its bound where lower): no cell is left pricing drafts or small batches at 10x
    r = 0.016 / 0.120
    assert _grid(ev.profile) == pytest.approx([0.010 * r, 0.012 * r, 0.011 * r, 0.013 * r, 0.100 * r, 0.016])
    assert ev.profile.verify_one == pytest.approx((0.010 * r, 0.011 * r, 0.016))


def _grid(profile: CostProfile) -> list[float]:
    return [t for row in profile.seconds for t in row]


def test_a_cell_moves_only_when_enough_passes_confirm_it() -> None:
    ev = CostEvidence(_profile(10.0), confirm=3)
    assert not ev.observe(1, 1.0, 0.001)  # one freak timing (a mis-recorded pass) moves nothing
    assert not ev.observe(1, 1.0, 0.004)
    assert ev.profile.seconds[0][0] == pytest.approx(0.02)
    assert ev.observe(1, 1.0, 0.005)
    assert ev.profile.seconds[0][0] == 0.005  # the third smallest of 1, 4 and 5 ms
    assert ev.observe(1, 1.0, 0.003)
    assert ev.profile.seconds[0][0] == 0.004  # now of 1, 3 and 4 ms


def test_noise_above_the_floor_never_raises_a_cell() -> None:
    clean = _profile()
    ev = CostEvidence(clean, confirm=1)
    for seconds in (0.05, 0.3, 0.0061, 2.0):  # every pass slower than the cells it covers
        assert not ev.observe(4, 2.0, seconds)
    assert ev.profile == clean
    spoiled = CostEvidence(_profile(10.0), confirm=1)
    assert spoiled.observe(4, 2.0, 0.009)
    corrected = spoiled.profile
    assert max(_grid(corrected)) == 0.009
    assert not spoiled.observe(4, 2.0, 0.5)  # interference later: the cells keep the faster evidence
    assert spoiled.profile == corrected


def test_a_pass_outside_the_grid_bounds_nothing() -> None:
    ev = CostEvidence(CostProfile((2, 4), (1, 2), ((1.0, 1.0), (1.0, 1.0))), confirm=1)
    assert not ev.observe(1, 1.0, 0.001)  # fewer sequences than the smallest batch size
    assert not ev.observe(4, 1.0, math.inf)
    assert np.isinf(ev.bounds).all()


def test_bounds_keep_the_corrected_grid_monotone() -> None:
    ev = CostEvidence(_profile(10.0), confirm=1)
    rng = np.random.default_rng(0)
    for _ in range(200):
        ev.observe(int(rng.integers(1, 6)), float(rng.uniform(1.0, 2.5)), float(rng.uniform(0.001, 0.08)))
    cells = profile_cells(ev.profile)
    assert (np.diff(cells[:, :-1], axis=1) >= 0).all() and (np.diff(cells, axis=0) >= 0).all()


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _plain_passes(control: DraftCapController, clock: _Clock, n: int, seconds: float) -> None:
    """n passes over 4 sequences with nothing on offer (plain), `seconds` apart."""
    for _ in range(n):
        control.cap(4, [0, 0, 0, 0])
        clock.now += seconds


def test_the_overhead_and_the_cells_share_a_pass_without_double_counting() -> None:
    # every plain pass over 4 sequences takes 5 ms: a 4 ms forward (the clean cell) + 1 ms of engine
    clock = _Clock()
    clean = DraftCapController(SpeculationSpec(), _profile(), AcceptanceTracker(), evidence=CostEvidence(_profile()),
                           clock=clock)
    _plain_passes(clean, clock, 6, 0.005)
    assert clean.profile is not None and clean.profile.seconds == _profile().seconds  # 5 ms > 4 ms: kept
    assert clean.calibration.plain == pytest.approx(0.001)  # the overhead is what the cell leaves over
    # the same passes priced by a profile measured 10x too slow: the cell takes the evidence
    clock = _Clock()
    spoiled = DraftCapController(SpeculationSpec(), _profile(10.0), AcceptanceTracker(),
                             evidence=CostEvidence(_profile(10.0)), clock=clock)
    _plain_passes(spoiled, clock, 6, 0.005)
    assert spoiled.profile is not None and spoiled.profile.seconds[1][0] == pytest.approx(0.005)
    # the first two passes (unconfirmed: 5 ms against 40) were no pass for the calibration; after
    # that the cell explains the whole pass, and nothing is left for the overhead
    assert spoiled.calibration.plain == pytest.approx(0.0, abs=1e-12)
    # both predict what was measured
    for c in (clean, spoiled):
        assert c.profile is not None
        assert c.profile.cost(4, 1.0) + c.calibration.extra(False) == pytest.approx(0.005)


def test_a_grid_too_slow_is_not_explained_by_a_negative_overhead() -> None:
    clock = _Clock()
    control = DraftCapController(SpeculationSpec(), _profile(2.0), AcceptanceTracker(),
                             evidence=CostEvidence(_profile(2.0), confirm=3), clock=clock)
    _plain_passes(control, clock, 2, 0.005)  # one pass timed: 5 ms against a predicted 8 ms
    assert control.calibration.plain == pytest.approx(0.0, abs=1e-12)  # not -3 ms: every pass would look cheaper
    assert control.profile is not None and control.profile.seconds[1][0] == 0.008  # not confirmed yet


def test_without_evidence_the_profile_is_taken_as_given() -> None:
    clock = _Clock()
    control = DraftCapController(SpeculationSpec(), _profile(2.0), AcceptanceTracker(), clock=clock)
    _plain_passes(control, clock, 6, 0.005)
    assert control.profile == _profile(2.0)


def _entry(measured: list[list[float]], at: float) -> CacheEntry:
    shape = (2, 3)
    return CacheEntry((1, 2), (1, 2), 8, np.array(measured), np.full(shape, at), np.full(shape, np.inf),
                      np.full(shape, -np.inf))


def test_a_cache_entry_keeps_the_smaller_of_measurement_and_evidence() -> None:
    e = _entry([[0.02, 0.03, 0.025], [0.04, 0.06, 0.05]], at=100.0)
    bounds = np.array([[0.005, np.inf, 0.007], [0.005, np.inf, np.inf]])
    assert e.merge(bounds, now=200.0)
    assert not e.merge(bounds * 2, now=300.0)  # higher evidence changes nothing, not even its time
    assert e.observed_at[0, 0] == 200.0 and e.observed_at[0, 1] == -np.inf
    p = e.profile()
    assert p.seconds == ((0.005, 0.03), (0.005, 0.06)) and p.verify_one == (0.007, 0.05)
    back = CacheEntry.from_json(json.loads(json.dumps(e.to_json())), written=0.0)
    assert back.profile() == p and back.due(now=300.0) == e.due(now=300.0)


def test_cells_due_again_are_the_old_and_the_ones_passes_showed_disturbed() -> None:
    e = _entry([[0.02, 0.03, 0.025], [0.04, 0.06, 0.05]], at=1000.0)
    assert e.due(now=1000.0 + MAX_AGE_S - 1) == []
    assert e.due(now=1000.0 + MAX_AGE_S + 1) == [(i, j) for i in range(2) for j in range(3)]  # too old
    e.measured_at[1, 2] = 500.0
    assert e.due(now=1000.0 + MAX_AGE_S - 1) == [(1, 2)]
    e.measured_at[1, 2] = 1000.0
    # passes after the measurement: one cell ran in under half of it (disturbed), two in more than half
    e.merge(np.array([[0.009, 0.02, np.inf], [0.03, np.inf, np.inf]]), now=2000.0)
    assert e.due(now=2000.0) == [(0, 0)]
    # a majority of the evidenced cells disturbed: the whole measurement is suspect, so every
    # cell of it is measured again, those no pass has bounded and the one bounded at 3/4 too
    e.merge(np.array([[0.009, 0.01, np.inf], [0.03, np.inf, np.inf]]), now=2100.0)
    assert e.due(now=2100.0) == [(i, j) for i in range(2) for j in range(3)]
    # measured again after the evidence: the evidence no longer says anything against them
    e.remeasured({c: 0.02 for c in e.due(now=2100.0)}, now=2200.0)
    assert e.due(now=2200.0) == []


def test_a_version_1_cache_entry_counts_as_measured_when_written() -> None:
    v1 = {"batch_sizes": [1, 2], "tokens": [1, 2], "seconds": [[0.02, 0.03], [0.04, 0.06]],
          "verify_one": [0.025, 0.05], "context": 8}
    e = CacheEntry.from_json(v1, written=5000.0)
    assert e.profile() == CostProfile((1, 2), (1, 2), ((0.02, 0.03), (0.04, 0.06)), (0.025, 0.05))
    assert e.due(now=5000.0 + MAX_AGE_S + 1) == [(i, j) for i in range(2) for j in range(3)]


def test_the_first_measurement_reports_every_cell_then_the_cache_is_used_as_is(
        tiny_model: TinyLlama, tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    first = ProfileStore.open(tiny_model, **GRID, progress=lambda d, t: calls.append((d, t)), folder=tmp_path)
    assert calls == [(k, 6) for k in range(7)]
    calls.clear()
    again = ProfileStore.open(tiny_model, **GRID, progress=lambda d, t: calls.append((d, t)), folder=tmp_path)
    assert calls == [(0, 0)] and again.profile == first.profile


def test_corrected_cells_are_cached_for_the_next_run(tiny_model: TinyLlama, tmp_path: Path) -> None:
    store = ProfileStore.open(tiny_model, **GRID, folder=tmp_path)
    evidence = CostEvidence(store.profile, confirm=1)
    lower = 0.9 * store.profile.seconds[1][0]  # below the cell, not far enough below to doubt it
    evidence.observe(2, 1.0, lower)
    assert store.update(evidence) == 0
    reopened = ProfileStore.open(tiny_model, **GRID, folder=tmp_path)
    assert reopened.profile.seconds[1][0] == lower
    assert reopened.profile == evidence.profile


def _write_entry(store: ProfileStore, **changes: np.ndarray) -> None:
    for name, value in changes.items():
        setattr(store.entry, name, value)
    store.write()


def test_stale_cells_are_measured_again_at_start_up(tiny_model: TinyLlama, tmp_path: Path) -> None:
    store = ProfileStore.open(tiny_model, **GRID, folder=tmp_path)
    at = store.entry.measured_at.copy()
    at[0, 1] = at[1, 2] = time.time() - 2 * MAX_AGE_S
    _write_entry(store, measured_at=at)
    calls: list[tuple[int, int]] = []
    again = ProfileStore.open(tiny_model, **GRID, progress=lambda d, t: calls.append((d, t)), folder=tmp_path)
    assert calls == [(0, 2), (1, 2), (2, 2)]
    assert again.measured == {(0, 1), (1, 2)}
    assert (again.entry.measured_at > time.time() - 60).all()


def test_a_measurement_passes_proved_disturbed_is_measured_again_at_start_up(
        tiny_model: TinyLlama, tmp_path: Path) -> None:
    store = ProfileStore.open(tiny_model, **GRID, folder=tmp_path)
    spoiled = store.entry.measured * 1000  # taken while the machine was busy
    _write_entry(store, measured=spoiled, measured_at=np.full((2, 3), time.time() - 60))
    evidence = CostEvidence(ProfileStore.open(tiny_model, **GRID, folder=tmp_path).profile, confirm=1)
    evidence.observe(2, 1.5, float(spoiled[0, 0]) / 100)  # bounds the 1-token and verify cells, far below
    store = ProfileStore.open(tiny_model, **GRID, folder=tmp_path)
    assert store.update(evidence) == 6  # 4 evidenced and disturbed: the 2 unseen are suspect too
    assert (store.entry.measured < spoiled).all()
    assert evidence.profile == store.profile  # rebased: the run prices passes with the new cells
    assert store.update(evidence) == 0  # at most once per run, whatever the evidence says
    calls: list[tuple[int, int]] = []
    ProfileStore.open(tiny_model, **GRID, progress=lambda d, t: calls.append((d, t)), folder=tmp_path)
    assert calls == [(0, 0)]  # measured after the evidence: the next run trusts the cache


def test_a_damaged_cache_entry_is_measured_afresh(tiny_model: TinyLlama, tmp_path: Path) -> None:
    store = ProfileStore.open(tiny_model, **GRID, folder=tmp_path)
    store.path.write_text('{"version": 2, "batch_sizes": [1, 2], "tokens": [1, 2], "seconds": [[1, -1]]}')
    calls: list[tuple[int, int]] = []
    ProfileStore.open(tiny_model, **GRID, progress=lambda d, t: calls.append((d, t)), folder=tmp_path)
    assert calls[0] == (0, 6) and CacheEntry.from_json(json.loads(store.path.read_text()), 0.0).due(time.time()) == []


def test_a_jobs_speculation_reports_the_measurement_and_keeps_what_its_steps_showed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RHYMERL_CACHE", str(tmp_path))
    model = TinyLlama(ModelConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=512)).eval()
    job = make_job("algorithm.group_size=2", "algorithm.prompts_per_step=2", base="defaults")  # batches up to 4: (1, 4)
    calls: list[tuple[int, int]] = []
    spec = RolloutSpeculation.for_job(job, model, MemoryHistoryStore(), progress=lambda d, t: calls.append((d, t)))
    assert calls == [(k, 16) for k in range(17)]  # 2 batch sizes x (7 token columns + verify)
    assert spec.control.evidence is not None and spec.control.profile == spec.control.evidence.profile
    plain = spec.control.profile.seconds[1][0]
    for _ in range(3):  # a step's passes (confirmed by 3): the 1-token cells cost less than measured
        spec.control.evidence.observe(4, 1.0, 0.9 * plain)
    spec.keep_cost_evidence()
    calls.clear()
    again = RolloutSpeculation.for_job(job, model, MemoryHistoryStore(), progress=lambda d, t: calls.append((d, t)))
    assert calls == [(0, 0)] and again.control.profile is not None
    assert again.control.profile.seconds[1][0] == 0.9 * plain


def test_the_local_runner_shows_the_measurement_then_says_what_it_did() -> None:
    console = Console(file=io.StringIO(), width=100, force_terminal=False)
    progress = Progress(TextColumn("{task.description}"), MofNCompleteColumn(), TextColumn("{task.fields[unit]}"),
                        console=console)
    report = profile_reporter(progress, console)
    report(0, 3)
    report(2, 3)
    (task,) = progress.tasks
    assert task.description == "verify cost"
    assert (task.completed, task.total, task.fields["unit"]) == (2, 3, "cells")
    report(3, 3)
    assert progress.tasks == []  # the bar gives way to one line
    report(0, 4)
    report(1, 1)  # the budget ended the measurement after one cell
    report(0, 0)
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines[0].startswith("measuring verify cost on this machine: 3 cells (kept for later runs in ")
    assert lines[1].startswith("verify cost: measured 3 cells in ")
    assert lines[3].startswith("verify cost: measured 1 cells of 4 (the rest start as upper bounds, timed between "
                               "steps) in ")
    assert lines[4].startswith("verify cost: using this machine's cached profile")


def test_estimates_bound_the_cells_a_first_run_had_no_time_for_from_above() -> None:
    # batches (1, 4) x tokens (1, 2) and the verify column (a block two wide): 1, 2, 2 / 4, 8, 8 token-rows
    timed = {(0, 0): 1.0, (0, 1): 1.5, (0, 2): 1.2}
    got = estimated_bounds((1, 4), (1, 2), timed)
    # (1, 0): only (0, 0) is no bigger: 1.0 x 4; (1, 1) and (1, 2): the least of 1 x 8, 1.5 x 4, 1.2 x 4
    assert got == pytest.approx({(1, 0): 4.0, (1, 1): 4.8, (1, 2): 4.8})


@settings(max_examples=100, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.001, 1.0), st.sets(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1))
def test_no_estimate_is_below_a_pass_cost_of_a_fixed_part_and_parts_growing_with_sequences_and_tokens(
        fixed: float, per_sequence: float, per_token: float, timed_cells: set[tuple[int, int]]) -> None:
    batches, tokens = (1, 4, 16), (1, 3, 9)
    def cost(cell: tuple[int, int]) -> float:
        b, t = batches[cell[0]], cell_tokens(tokens, cell[1])
        return fixed + per_sequence * b + per_token * b * t
    timed = {c: cost(c) for c in timed_cells | {(0, 0)}}
    for cell, bound in estimated_bounds(batches, tokens, timed).items():
        assert bound >= cost(cell) * (1 - 1e-12)


def test_a_first_run_past_its_budget_times_the_cheapest_cell_and_each_step_times_the_next_due(
        tiny_model: TinyLlama, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_cost, "FIRST_BUDGET_S", 0.0)  # no second cell starts: forced, not timed
    monkeypatch.setattr(verify_cost, "STEP_BUDGET_S", 0.0)
    calls: list[tuple[int, int]] = []
    store = ProfileStore.open(tiny_model, **GRID, progress=lambda d, t: calls.append((d, t)), folder=tmp_path)
    assert store.measured == {(0, 0)}  # batch 1, 1 token: the cheapest pass
    assert calls == [(0, 6), (1, 6), (1, 1)]  # the budget ends it: the rest start as estimates
    first = store.entry.measured[0, 0]
    # every other cell is an upper bound scaled from it (batch x tokens; the verify block is two wide), and due
    assert store.entry.measured[1, 1] == pytest.approx(first * 4) and store.entry.measured[0, 2] == pytest.approx(first * 2)
    assert sorted(store.entry.due(time.time())) == [(0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert store.update(CostEvidence(store.profile, confirm=1)) == 1
    assert store.measured == {(0, 0), (0, 1)}  # the cheapest due cell next (2 token-rows)
    reopened = ProfileStore.open(tiny_model, **GRID, folder=tmp_path)  # a later run goes on where it stopped
    assert reopened.measured == {(0, 2)}
