"""Tier 2 of HistoPipe: how many workers each ranking group gets (RhymeRL §6.4).

With equal workers per group, long-tailed lengths make group completion times grow roughly
exponentially from the shortest group to the longest, and the alternating pipeline cannot fill
the gap. Tier 2 gives short groups fewer workers and long groups more, so that completion times
grow linearly with worker position; then a step laid out ascending and the next laid out
descending add up to about the same time on every worker.

The allocation problem is integer and nonlinear; we solve it by binary search on the target
span T of a linear ramp tau(x) = T * (rho + (1 - rho) * x / N) over worker positions x: each
group, in ascending order, takes the fewest workers n with t_g(n) <= tau(end of its range). The
smallest feasible T is found by bisection (feasibility is monotone in T), for a few ramp offsets
rho, and the plan whose predicted two-step load per worker is smallest wins.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

RAMPS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Allocation:
    workers_per_group: list[int]
    predicted: list[float]
    """Predicted completion time of each group with its workers."""
    ramp: float
    pair_time: float
    """Predicted time per step of two consecutive steps laid out in opposite orders (max over workers / 2)."""


def _greedy(costs: NDArray[np.float64], total: int, span: float, ramp: float) -> list[int] | None:
    groups = costs.shape[0]
    counts: list[int] = []
    start = 0
    for g in range(groups):
        room = total - start - (groups - 1 - g)  # leave one worker for each later group
        chosen = None
        for n in range(1, room + 1):
            tau = span * (ramp + (1.0 - ramp) * (start + n) / total)
            if costs[g, n - 1] <= tau:
                chosen = n
                break
        if chosen is None:
            return None
        counts.append(chosen)
        start += chosen
    return counts


def _fill(costs: NDArray[np.float64], counts: list[int], total: int) -> list[int]:
    """Hand leftover workers, one at a time, to the group predicted to finish last."""
    counts = list(counts)
    for _ in range(total - sum(counts)):
        g = max(range(len(counts)), key=lambda i: costs[i, counts[i] - 1])
        counts[g] += 1
    return counts


def pair_time(costs: NDArray[np.float64], counts: list[int]) -> float:
    """Per-step time when one step is laid out ascending and the next descending with these counts."""
    per_worker = np.concatenate([np.full(n, costs[g, n - 1]) for g, n in enumerate(counts)])
    return float(np.max(per_worker + per_worker[::-1])) / 2.0


def allocate(costs: NDArray[np.float64], total: int, ramps: tuple[float, ...] = RAMPS, iters: int = 40) -> Allocation:
    """costs[g, n-1] = predicted completion time of ranking group g (ascending) on n workers.

    Needs total >= number of groups; each group gets at least one worker.
    """
    groups = costs.shape[0]
    if groups == 0:
        return Allocation([], [], 0.0, 0.0)
    if costs.shape[1] < total:
        raise ValueError("costs: need a column for every worker count 1..total")
    if total < groups:
        raise ValueError(f"{groups} ranking groups need at least {groups} workers, got {total}")
    best: Allocation | None = None
    hi0 = float(np.max(costs[:, 0])) * 2.0 * total + 1e-9  # every ramp is feasible with one worker each
    for ramp in ramps:
        lo, hi = 0.0, hi0
        if _greedy(costs, total, hi, ramp) is None:
            continue
        for _ in range(iters):
            mid = (lo + hi) / 2.0
            if _greedy(costs, total, mid, ramp) is None:
                lo = mid
            else:
                hi = mid
        counts = _greedy(costs, total, hi, ramp)
        assert counts is not None
        counts = _fill(costs, counts, total)
        cand = Allocation(
            workers_per_group=counts,
            predicted=[float(costs[g, n - 1]) for g, n in enumerate(counts)],
            ramp=ramp,
            pair_time=pair_time(costs, counts),
        )
        if best is None or cand.pair_time < best.pair_time - 1e-12:
            best = cand
    if best is None:  # cannot happen: ramp 1 with span >= max cost on 1 worker is always feasible
        counts = [1] * groups
        counts = _fill(costs, counts, total)
        best = Allocation(counts, [float(costs[g, n - 1]) for g, n in enumerate(counts)], 1.0, pair_time(costs, counts))
    return best
