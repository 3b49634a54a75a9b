"""The tier-2 cost model's fast paths (issue 27: the fleet recommendation prices every size every
step): the vectorised slot-filling walk and the lanes priced at once give the seconds of the event
walk and of pricing each lane apart."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.algorithms.scheduling import RooflineProfile, TableProfile, group_decode_time, worker_decode_time
from rhymerl.algorithms.scheduling.costmodel import (
    NO_SPECULATION,
    SpeculationSpeedup,
    event_walk,
    walk_decode_time,
)


def test_a_two_slot_worker_runs_eight_equal_samples_in_four_waves() -> None:
    capped = TableProfile.constant(1.0, max_batch=2)
    assert walk_decode_time(np.full(8, 50.0), 10.0, capped, NO_SPECULATION) == pytest.approx(200.0)
    # 3 slots, lengths 30, 10, 20, 5: the 5 starts when the 10 ends (10), so the worker ends at 30
    assert walk_decode_time(np.array([30.0, 10.0, 20.0, 5.0]), 0.0, TableProfile.constant(1.0, max_batch=3),
                            NO_SPECULATION) == pytest.approx(30.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=40), st.integers(1, 8),
       st.sampled_from([None, 4_000, 20_000, 200_000]), st.sampled_from([1.0, 2.5]))
def test_the_walk_gives_the_event_walks_seconds_whatever_the_cache(lengths: list[int], slots: int, kv: int | None,
                                                                    alpha: float) -> None:
    profile = RooflineProfile(max_batch=slots, hbm_bytes=15.2e9 / 0.9 + (kv or 10**9) * 57_344.0 / 0.9)
    spec = SpeculationSpeedup(tokens_per_pass=alpha)
    queue = np.array(lengths, dtype=np.float64)
    assert walk_decode_time(queue, 100.0, profile, spec) == pytest.approx(event_walk(queue, 100.0, profile, spec),
                                                                          rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2000), min_size=1, max_size=40), st.integers(1, 9), st.integers(1, 6))
def test_a_group_costs_its_slowest_snake_dealt_lane_priced_alone(lengths: list[int], workers: int, slots: int) -> None:
    profile = RooflineProfile(max_batch=slots, hbm_bytes=15.2e9 / 0.9 + 30_000 * 57_344.0 / 0.9)
    arr = np.array(lengths, dtype=np.float64)
    n = max(1, min(workers, arr.size))
    order = np.sort(arr)[::-1]
    rnd, pos = np.divmod(np.arange(order.size), n)
    lane = np.where(rnd % 2 == 0, pos, n - 1 - pos)
    expected = max(worker_decode_time(order[lane == w], 50.0, profile) for w in range(n))
    assert group_decode_time(arr, 50.0, workers, profile) == pytest.approx(expected, rel=1e-12)
