"""Tier 2: workers per ranking group by binary search on the profiled cost model."""

from __future__ import annotations

import numpy as np
import pytest

from rhymerl.algorithms.scheduling.tiering import allocate, pair_time


def _costs(work: list[float], workers: int) -> np.ndarray:
    """Perfectly divisible work: group g on n workers takes work[g] / n."""
    return np.array([[w / n for n in range(1, workers + 1)] for w in work])


def test_two_groups_on_four_workers_take_the_hand_checked_split() -> None:
    # (1,3): pair max(10+13.3, 13.3+13.3)/2 = 13.3; (2,2): every worker 5 + 20 -> 12.5; (3,1): 21.7
    alloc = allocate(_costs([10.0, 40.0], 4), 4)
    assert alloc.workers_per_group == [2, 2]
    assert alloc.pair_time == pytest.approx(12.5)
    assert alloc.predicted == pytest.approx([5.0, 20.0])


def test_pair_time_adds_an_ascending_step_to_the_next_descending_one() -> None:
    costs = _costs([10.0, 40.0], 4)
    assert pair_time(costs, [1, 3]) == pytest.approx((40 / 3 + 40 / 3) / 2)
    assert pair_time(costs, [3, 1]) == pytest.approx((10 / 3 + 40) / 2)


def test_exponential_group_times_become_closer_to_linear_than_with_equal_workers() -> None:
    work = [2.0**g for g in range(4)]  # each group twice the work of the previous
    costs = _costs(work, 16)
    alloc = allocate(costs, 16)
    equal = [costs[g, 3] for g in range(4)]  # 4 workers each

    def nonlinearity(times: list[float]) -> float:
        x = np.arange(len(times))
        fit = np.polyval(np.polyfit(x, times, 1), x)
        return float(np.max(np.abs(np.asarray(times) - fit)) / np.max(times))

    assert sum(alloc.workers_per_group) == 16
    assert alloc.workers_per_group == sorted(alloc.workers_per_group)  # longer groups never get fewer workers
    assert nonlinearity(alloc.predicted) < nonlinearity(equal)
    assert alloc.pair_time < pair_time(costs, [4, 4, 4, 4])


def test_every_group_gets_a_worker_and_all_workers_are_used() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        groups = int(rng.integers(1, 6))
        workers = int(rng.integers(groups, 12))
        alloc = allocate(_costs(sorted(rng.uniform(1, 100, groups).tolist()), workers), workers)
        assert min(alloc.workers_per_group) >= 1
        assert sum(alloc.workers_per_group) == workers


def test_more_groups_than_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="need at least 3 workers"):
        allocate(_costs([1, 2, 3], 2), 2)
