"""The adaptive speculation model: acceptance tracking and the cost-based draft cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rhymerl.algorithms.drafting.adaptive_cap import (
    AcceptanceTracker,
    CostCalibration,
    CostProfile,
    choose_cap,
)
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout.verify_cost import CacheEntry, load_or_measure


def test_expected_tokens_with_certain_acceptance_is_one_plus_k() -> None:
    t = AcceptanceTracker(prior=1.0)
    assert t.expected_tokens(0) == 1.0
    assert t.expected_tokens(4) == pytest.approx(5.0)


def test_expected_tokens_follows_the_conditional_chain() -> None:
    t = AcceptanceTracker(prior=0.5)
    # 1 + 0.5 + 0.25 + 0.125
    assert t.expected_tokens(3) == pytest.approx(1.875)


def test_tracker_counts_only_positions_that_were_tested() -> None:
    t = AcceptanceTracker(max_len=4, decay=1.0, prior_weight=0.0001)
    # draft of 4, 2 accepted: positions 0,1 accepted, position 2 rejected, position 3 never tested
    t.observe([4], [2])
    p = t.conditional()
    assert p[0] == pytest.approx(1.0, abs=1e-3) and p[1] == pytest.approx(1.0, abs=1e-3)
    assert p[2] == pytest.approx(0.0, abs=1e-3)
    assert t.offered[3] == 0.0 and p[3] == pytest.approx(p[2], abs=1e-3)


def test_an_untested_position_leans_on_the_one_before_not_on_the_prior() -> None:
    t = AcceptanceTracker(decay=1.0, prior=0.5, prior_weight=2.0)
    for _ in range(50):
        t.observe([2], [2])  # positions 0 and 1 always accepted, position 2 never offered
    p = t.conditional()
    assert p[1] > 0.95 and p[2] == pytest.approx(p[1])
    assert t.expected_tokens(4) > 4.5  # a longer cap is judged on the evidence, not on 0.5


def _flat_profile(per_token: float, base: float) -> CostProfile:
    # t(B, n) = base + per_token * B * n: verifying costs in proportion to the tokens appended
    batches, tokens = (1, 16, 256), (1, 2, 3, 5, 9, 17, 33)
    return CostProfile(batches, tokens, tuple(tuple(base + per_token * b * n for n in tokens) for b in batches))


def test_good_drafts_on_a_small_batch_get_a_long_cap() -> None:
    t = AcceptanceTracker(prior=0.95)
    assert choose_cap(_flat_profile(per_token=1e-6, base=0.01), batch=1, tracker=t) == 32


def test_poor_drafts_on_a_compute_bound_batch_switch_speculation_off() -> None:
    t = AcceptanceTracker(prior=0.1)
    assert choose_cap(_flat_profile(per_token=1e-3, base=0.001), batch=256, tracker=t) == 0


def test_the_cap_never_exceeds_the_window_limit() -> None:
    t = AcceptanceTracker(prior=1.0)
    assert choose_cap(_flat_profile(1e-6, 0.01), batch=1, tracker=t, limit=8) == 8


def test_profile_interpolates_between_grid_points() -> None:
    prof = CostProfile((1, 3), (1, 3), ((1.0, 3.0), (3.0, 5.0)))
    assert prof.cost(2, 2) == pytest.approx(3.0)
    assert prof.cost(1, 1) == pytest.approx(1.0)


def test_a_pass_with_any_draft_is_priced_from_the_verify_path() -> None:
    prof = CostProfile((1,), (1, 2), ((1.0, 2.0),), verify_one=(1.5,))
    assert prof.cost(1, 1.0) == pytest.approx(1.0)   # plain decoding: the one-token path
    assert prof.cost(1, 1.5) == pytest.approx(1.75)  # halfway from the verify path's 1.5 to 2 tokens' 2.0
    assert CostProfile((1,), (1, 2), ((1.0, 2.0),)).cost(1, 1.5) == pytest.approx(1.5)
    # kept between plain decoding and the 2-token column (disturbed timings), and only between them
    assert CostProfile((1,), (1, 2), ((1.0, 2.0),), verify_one=(3.0,)).cost(1, 1.5) == pytest.approx(2.0)
    assert CostProfile((1,), (1, 2), ((1.0, 2.0),), verify_one=(0.5,)).cost(1, 1.5) == pytest.approx(1.5)
    assert prof.cost(1, 2.0) == pytest.approx(2.0)
    assert prof.cost(1, 3.0) == pytest.approx(3.0)  # extrapolated from the plain grid's slope, as without it


def test_a_few_poor_drafts_do_not_pay_for_moving_the_pass_onto_the_verify_path() -> None:
    # 64 sequences, 2 with a 1-token draft accepted half the time: 62 + 2 * 1.5 = 65 tokens
    grid = ((1.0, 1.1),)
    t = AcceptanceTracker(prior=0.5)
    cheap = CostProfile((64,), (1, 2), grid)  # priced at 1 + (2/64) * 0.1: 65 / 1.003 > 64 / 1.0
    assert choose_cap(cheap, batch=64, tracker=t, lengths=[1, 1] + [0] * 62) == 1
    dear = CostProfile((64,), (1, 2), grid, verify_one=(1.08,))  # 65 / 1.0806 < 64 / 1.0
    assert choose_cap(dear, batch=64, tracker=t, lengths=[1, 1] + [0] * 62) == 0


def test_a_profile_needs_a_verify_cost_per_batch_size() -> None:
    with pytest.raises(ValueError, match="verify_one"):
        CostProfile((1, 4), (1, 2), ((1.0, 2.0), (2.0, 3.0)), verify_one=(1.5,))


def test_a_profile_with_unsorted_axes_is_rejected() -> None:
    with pytest.raises(ValueError, match="increasing"):
        CostProfile((4, 1), (1,), ((1.0,), (2.0,)))


def test_a_disturbed_profile_is_made_monotone() -> None:
    from rhymerl.workers.rollout.verify_cost import monotone

    assert monotone([[1.0, 0.5, 2.0], [0.8, 3.0, 1.0]]) == ((1.0, 1.0, 2.0), (1.0, 3.0, 3.0))


def test_costs_the_profile_does_not_see_can_tip_the_balance_to_plain_decoding() -> None:
    t = AcceptanceTracker(prior=0.4)
    prof = _flat_profile(per_token=1e-5, base=0.004)
    assert choose_cap(prof, batch=8, tracker=t) > 0
    dear = CostCalibration(spec=0.004, plain=0.0)  # drafting and sampling add 4 ms to a speculative pass
    assert choose_cap(prof, batch=8, tracker=t, calibration=dear) == 0


def test_a_fixed_cost_per_pass_makes_longer_drafts_pay() -> None:
    # verifying costs in proportion to tokens: p = 0.6 drafts do not pay on the profile alone ...
    t = AcceptanceTracker(prior=0.6)
    prof = _flat_profile(per_token=1e-3, base=0.0)
    assert choose_cap(prof, batch=4, tracker=t) == 0
    # ... but they do once every real pass is known to cost 20 ms more than its forward
    fixed = CostCalibration(spec=0.02, plain=0.02)
    assert choose_cap(prof, batch=4, tracker=t, calibration=fixed) > 0


def test_calibration_tracks_the_excess_of_measured_over_predicted_per_kind() -> None:
    c = CostCalibration(alpha=0.5)
    assert c.extra(True) == 0.0 and c.extra(False) == 0.0
    c.observe(True, measured=0.03, predicted=0.02)
    assert c.extra(True) == pytest.approx(0.01)
    assert c.extra(False) == 0.0  # not seen yet: the least a plain pass could cost
    c.observe(False, measured=0.012, predicted=0.01)
    c.observe(False, measured=0.01, predicted=0.01)  # EMA: 0.5 * 0.002 + 0.5 * 0.0
    assert c.extra(False) == pytest.approx(0.001)
    assert c.extra(True) == pytest.approx(0.01)


def test_a_speculative_pass_not_seen_yet_costs_at_least_what_a_plain_one_does() -> None:
    c = CostCalibration()
    c.observe(False, measured=0.015, predicted=0.01)
    assert c.extra(True) == c.extra(False) == pytest.approx(0.005)


def test_plain_decoding_is_tried_once_drafting_proved_dearer_than_its_gain_before_any_plain_pass() -> None:
    """Drafts on offer from the first pass: every pass so far drafted and cost 4 ms more than the
    profile. Whether plain decoding shares that overhead is unknown until it runs: priced at none
    of it, it is chosen (and then measured); priced at the drafts' overhead, drafting at p = 0.3
    would go on, paying 4 ms a pass for 0.3 tokens."""
    t = AcceptanceTracker(prior=0.3)
    prof = _flat_profile(per_token=1e-4, base=0.004)
    seen = CostCalibration()
    seen.observe(True, measured=0.0125, predicted=0.0085)
    assert choose_cap(prof, batch=8, tracker=t, lengths=[2] * 8) > 0  # on the profile alone, drafting pays
    assert choose_cap(prof, batch=8, tracker=t, lengths=[2] * 8, calibration=seen) == 0
    # once plain passes were seen to cost as much beyond the profile, drafting is back
    seen.observe(False, measured=0.0088, predicted=0.0048)
    assert choose_cap(prof, batch=8, tracker=t, lengths=[2] * 8, calibration=seen) > 0


def test_a_gap_between_rollouts_is_not_taken_for_a_pass() -> None:
    c = CostCalibration()
    c.observe(True, measured=2.0, predicted=0.01)  # 200x: the trainer ran in between
    c.observe(False, measured=0.001, predicted=0.01)
    assert c.spec is None and c.plain is None


def test_the_cap_stops_at_the_longest_draft_on_offer() -> None:
    t = AcceptanceTracker(prior=1.0)
    assert choose_cap(_flat_profile(1e-6, 0.01), batch=2, tracker=t, lengths=[3, 1]) == 4


def test_nothing_on_offer_means_plain_decoding() -> None:
    t = AcceptanceTracker(prior=1.0)
    assert choose_cap(_flat_profile(1e-6, 0.01), batch=8, tracker=t, lengths=[0, 0, 0]) == 0


def test_sequences_without_a_draft_are_priced_at_one_token() -> None:
    # t(B, n) = 0.02 + 1e-3 * B * n; 4 sequences, one offers 4 tokens, each accepted with p = 0.5.
    # tokens per second: off 4 / 0.024 = 166.7; cap 1: 4.5 / 0.025 = 180.0; cap 2: 4.75 / 0.026
    # = 182.7; cap 4: 4.9375 / 0.028 = 176.3 (a pass of 8 tokens is priced as 2 per sequence)
    t = AcceptanceTracker(prior=0.5)
    prof = _flat_profile(per_token=1e-3, base=0.02)
    assert choose_cap(prof, batch=4, tracker=t, lengths=[4, 0, 0, 0]) == 2
    # with speculative passes measured 5 ms dearer than predicted it no longer pays (cap 2: 150 per s)
    assert choose_cap(prof, batch=4, tracker=t, lengths=[4, 0, 0, 0],
                      calibration=CostCalibration(spec=0.005, plain=0.0)) == 0


@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=12), extra=st.integers(0, 6),
       p=st.floats(0.05, 0.99), base=st.floats(1e-4, 1e-1), per_token=st.floats(1e-6, 1e-2))
def test_the_cap_maximises_expected_tokens_per_second(lengths: list[int], extra: int, p: float, base: float,
                                                      per_token: float) -> None:
    t = AcceptanceTracker(prior=p)
    prof = _flat_profile(per_token, base)
    batch = len(lengths) + extra

    def rate(k: int) -> float:  # brute force: expected tokens of every sequence over the pass's cost
        tokens = extra + sum(sum(p**j for j in range(min(n, k) + 1)) for n in lengths)
        cells = batch + sum(min(n, k) for n in lengths)
        return tokens / prof.cost(batch, cells / batch)

    chosen = choose_cap(prof, batch, t, lengths=lengths)
    assert rate(chosen) >= max(rate(k) for k in (0, 1, 2, 4, 8, 16, 32)) * (1 - 1e-9)


@given(passes=st.lists(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=8), max_size=5))
def test_the_tracker_counts_as_a_per_position_loop_would(passes: list[list[tuple[int, int]]]) -> None:
    t = AcceptanceTracker(max_len=8, decay=0.9)
    offered, taken = [0.0] * 8, [0.0] * 8
    for rows in passes:
        rows = [(d, min(a, d)) for d, a in rows]  # accepted never exceeds drafted
        t.observe([d for d, _ in rows], [a for _, a in rows])
        offered, taken = [o * 0.9 for o in offered], [x * 0.9 for x in taken]
        for d, a in rows:  # position j was tested when all before it were accepted, taken when j < a
            for j in range(min(a + 1, d, 8)):
                offered[j] += 1.0
                taken[j] += j < a
    assert t.offered.tolist() == pytest.approx(offered) and t.taken.tolist() == pytest.approx(taken)


def test_a_measured_profile_is_cached_with_its_verify_costs_and_read_back(
        tiny_model: TinyLlama, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RHYMERL_CACHE", str(tmp_path))
    first = load_or_measure(tiny_model, context=8, batches=(1, 2), tokens=(1, 2))
    assert first.verify_one is not None and len(first.verify_one) == 2 and min(first.verify_one) > 0
    (entry,) = (tmp_path / "profiles").glob("*.json")
    assert load_or_measure(tiny_model, context=8, batches=(1, 2), tokens=(1, 2)) == first
    entry.write_text('{"batch_sizes": [1, 2]}')  # damaged: re-measured, not trusted
    again = load_or_measure(tiny_model, context=8, batches=(1, 2), tokens=(1, 2))
    assert again.verify_one is not None and CacheEntry.from_json(json.loads(entry.read_text()), 0.0).profile() == again
