"""The continuous-batching rules shared by the tier-2 cost model and the simulator."""

from __future__ import annotations

import math

from rhymerl.algorithms.scheduling.batching import admits, last_fitting_iteration, segment_seconds


class Linear:
    def iteration_time(self, batch: int, context: float) -> float:
        return 0.001 * batch + 0.0001 * context


def test_admission_keeps_one_percent_of_the_cache_free() -> None:
    # 900 cached + 80 prompt + 0 generated + 2 sequences x 1 token = 982 <= 990 of a 1000-token cache
    assert admits(900.0, 80, 0, 2, 1.0, 1000.0)
    assert not admits(900.0, 80, 8, 3, 1.0, 1000.0)  # 991 > 990


def test_an_empty_worker_takes_a_sequence_longer_than_its_cache() -> None:
    assert admits(0.0, 5000, 0, 1, 1.0, 1000.0)
    assert admits(0.0, 5000, 0, 2, 1.0, math.inf)


def test_the_cache_overflows_after_the_last_fitting_iteration() -> None:
    # c0 = 100, 4 sequences x 2 tokens per iteration: 100 + 8 * it <= 1000 until it = 112
    assert last_fitting_iteration(100.0, 4, 2.0, 1000.0) == 112


def test_a_constant_batch_costs_its_mean_context() -> None:
    # 3 sequences from iteration 10 to 20, c0 = 60, alpha 1: mean context (60 + 3 * 15) / 3 = 35
    assert math.isclose(segment_seconds(Linear(), 3, 60.0, 1.0, 10, 20), 10 * (0.003 + 0.0035))
