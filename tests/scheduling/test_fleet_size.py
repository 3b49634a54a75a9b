"""The fleet-size recommendation: hand-checked on a constant cost profile (every pass 1 s whatever
the batch, so n workers run n samples at once), and against the brute-force definition."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rhymerl.algorithms.scheduling import LengthHistory, TableProfile, group_decode_time
from rhymerl.algorithms.scheduling.fleet_size import calibration, predicted_lengths, recommend

FLAT = TableProfile.constant(1.0, max_batch=64)


def test_workers_that_shorten_nothing_are_not_wanted() -> None:
    # 4 samples of 100 tokens run in 100 passes on one worker (a continuous batch of 4 at 1 s a pass):
    # more workers buy nothing
    advice = recommend(np.full(4, 100.0), 10.0, FLAT, (1, 8))
    assert (advice.workers, advice.reason) == (1, "efficiency")
    assert advice.predicted_s[1] == advice.predicted_s[4] == pytest.approx(100.0)


def test_a_batch_capped_worker_is_worth_splitting_until_each_has_a_batch() -> None:
    capped = TableProfile.constant(1.0, max_batch=2)  # a worker runs 2 samples at once
    advice = recommend(np.full(8, 50.0), 10.0, capped, (1, 8))
    # 8 samples: 1 worker 4 waves (200 s), 2 -> 100 s, 4 -> 50 s, 8 -> 50 s: efficiency 1, 1, 1, 0.5
    assert advice.predicted_s[1] == pytest.approx(200.0) and advice.predicted_s[4] == pytest.approx(50.0)
    assert advice.workers == 4  # 5 to 8 are efficient enough, but shorten nothing more
    assert recommend(np.full(8, 50.0), 10.0, capped, (1, 8), efficiency=0.75).workers == 4
    # 7 samples: 4 workers leave one with a single sample; efficiency 200 / (4 x 50) = 1 still
    assert recommend(np.full(7, 50.0), 10.0, capped, (1, 8)).workers == 4


def test_with_rollout_overlapping_training_no_more_workers_than_keep_up_with_it() -> None:
    capped = TableProfile.constant(1.0, max_batch=2)
    # calibrated: this machine runs the model's seconds 3x slower; training takes 320 s, so 2 workers
    # (3 x 100 s) keep up and 4 would finish rollout early for nothing
    advice = recommend(np.full(8, 50.0), 10.0, capped, (1, 8), calibration=3.0, train_s=320.0)
    assert (advice.workers, advice.reason) == (2, "training")
    assert advice.predicted_s[2] == pytest.approx(300.0)


def test_the_bounds_hold_and_without_history_the_minimum_is_recommended() -> None:
    capped = TableProfile.constant(1.0, max_batch=2)
    assert recommend(np.full(8, 50.0), 10.0, capped, (1, 3)).workers == 2  # 3 would leave one with 3 samples
    assert (recommend(np.full(4, 100.0), 10.0, FLAT, (3, 8)).workers,
            recommend(np.full(4, 100.0), 10.0, FLAT, (3, 8)).reason) == (3, "bounds")
    assert recommend(np.zeros(0), 10.0, FLAT, (2, 8)).workers == 2
    # nothing predicts yet: the fleet keeps the size it has, within the bounds
    assert recommend(np.zeros(0), 10.0, FLAT, (2, 8), current=5).workers == 5
    assert recommend(np.zeros(0), 10.0, FLAT, (2, 8), current=12).workers == 8
    with pytest.raises(ValueError, match="bounds"):
        recommend(np.full(4, 1.0), 1.0, FLAT, (3, 2))


def test_predicted_lengths_spread_a_prompts_last_group_and_new_prompts_share_the_latest_lengths() -> None:
    h = LengthHistory()
    h.observe("a", [10, 20, 30, 40])
    lengths = predicted_lengths(h, ["a", "new"], 2)
    assert list(lengths[:2]) == pytest.approx([17.5, 32.5])  # the group's 25th and 75th percentiles
    assert list(lengths[2:]) == pytest.approx([17.5, 32.5])  # the same of every length seen
    # prompt ids that never recur: the new prompts' four samples take the 1/8 .. 7/8 quantiles
    assert list(predicted_lengths(h, ["x", "y"], 2)) == pytest.approx([13.75, 21.25, 28.75, 36.25])
    assert predicted_lengths(LengthHistory(), ["x"], 4).size == 0
    assert predicted_lengths(h, [], 4).size == 0  # the run's last step: nothing comes next


def test_the_latest_lengths_are_bounded_and_keep_the_newest() -> None:
    h = LengthHistory(recent=3)
    h.observe("a", [1, 2])
    h.observe("b", [3, 4])
    assert list(h.recent()) == [2.0, 3.0, 4.0]


def test_calibration_is_measured_over_predicted_summed_over_a_steps_rounds() -> None:
    capped = TableProfile.constant(1.0, max_batch=2)
    # two rounds: 8 samples on 2 workers (100 s predicted), 4 on 4 workers (50 s); 450 s measured
    rounds = [(300.0, np.full(8, 50.0), 2), (150.0, np.full(4, 50.0), 4)]
    assert calibration(rounds, 10.0, capped) == pytest.approx(450.0 / 150.0)
    assert calibration([(0.0, np.full(8, 50.0), 2)], 10.0, FLAT) == 1.0


@given(st.lists(st.integers(1, 400), min_size=1, max_size=24), st.integers(1, 6), st.integers(0, 5),
       st.sampled_from([0.3, 0.5, 0.8]), st.one_of(st.none(), st.floats(1.0, 2000.0)))
def test_the_recommendation_is_the_brute_force_rule(lengths: list[int], cap: int, extra: int, eff: float,
                                                   train: float | None) -> None:
    profile = TableProfile.constant(1.0, max_batch=cap)
    arr = np.array(lengths, dtype=np.float64)
    lo, hi = 1 + extra // 2, 1 + extra // 2 + extra
    t = {n: group_decode_time(arr, 10.0, n, profile) for n in range(1, hi + 1)}
    useful = [n for n in t if t[1] / (n * t[n]) >= eff] or [1]
    best = min(n for n in useful if t[n] <= min(t[m] for m in useful) * (1 + 1e-9))
    if train is not None:
        best = next((n for n in range(1, best + 1) if t[n] <= train), best)
    assert recommend(arr, 10.0, profile, (lo, hi), efficiency=eff, train_s=train).workers == min(max(best, lo), hi)
