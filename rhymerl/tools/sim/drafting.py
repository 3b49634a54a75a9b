"""What drafters on freed workers did in a simulated run, per step: how many workers drafted (the
count the controller would export as the step's `rollout_drafting_workers`), and the step's tail
(the last 10% of its samples) with the share of it during which some worker drafted."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

TAIL_SHARE = 0.1
"""The tail is the last 10% of a step's samples to finish."""


class DraftSpan(NamedTuple):
    drafter: int
    verifier: int
    start: float
    end: float


@dataclass(frozen=True)
class StepDrafting:
    step: int
    rollout_s: float
    """First admission of one of its samples to its last finish."""
    tail_s: float
    """From the finish that leaves the last 10% (rounded up, at least one) of its samples running to
    its last finish."""
    rollout_drafting_workers: int
    """The most workers drafting at once during the step (what the controller exports per step)."""
    drafting_workers_mean: float
    """Workers drafting, averaged over the step's time."""
    tail_drafting_share: float
    """Share of the tail during which at least one worker drafted."""


def _covered(spans: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of [lo, hi] covered by the union of the spans."""
    total, reach = 0.0, lo
    for s, e in sorted(spans):
        s, e = max(s, reach), min(e, hi)
        if e > s:
            total += e - s
            reach = e
    return total


def tail_start(finishes: Sequence[float]) -> float:
    """When the step's last 10% of samples (rounded up, at least one) were all that was left: the
    finish time of the last sample before them (the step's first finish when it has one sample)."""
    f = sorted(finishes)
    k = max(1, math.ceil(TAIL_SHARE * len(f)))
    return f[max(0, len(f) - k - 1)]


def step_drafting(spans: Sequence[DraftSpan], windows: Mapping[int, tuple[float, float]],
                  finishes: Mapping[int, Sequence[float]]) -> list[StepDrafting]:
    """Per step (windows: step -> (first admission, last finish); finishes: step -> its samples'
    finish times), the drafting counts and its tail."""
    out = []
    for step in sorted(windows):
        lo, hi = windows[step]
        inside = [(max(sp.start, lo), min(sp.end, hi)) for sp in spans if sp.end > lo and sp.start < hi]
        points = sorted({lo, hi, *(s for s, _ in inside), *(e for _, e in inside)})
        peak = 0
        for a, b in itertools.pairwise(points):
            mid = (a + b) / 2.0
            peak = max(peak, sum(1 for s, e in inside if s <= mid < e))
        t0 = tail_start(finishes[step])
        tail = hi - t0
        out.append(StepDrafting(
            step=step, rollout_s=hi - lo, tail_s=tail, rollout_drafting_workers=peak,
            drafting_workers_mean=sum(e - s for s, e in inside) / (hi - lo) if hi > lo else 0.0,
            tail_drafting_share=_covered(inside, t0, hi) / tail if tail > 0 else 0.0,
        ))
    return out
