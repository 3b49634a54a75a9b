"""Outlier rules of HistoPipe's migration-based rebalancing (RhymeRL §6.3), as pure functions.

A sample is an outlier when (1) it is among the last `tail_fraction` of its ranking group still
running and (2) it has already generated more than lambda times the longest response that the
group's prompts produced last epoch. Outliers of short groups move to a worker of a group that
is still running (intra-step); outliers of long groups move to the next step (inter-step). Either
way the generated tokens travel with the sample and the destination recomputes the KV cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


def tail_size(group_size: int, tail_fraction: float) -> int:
    """How many still-running samples make up a group's tail (at least one when enabled)."""
    if tail_fraction <= 0.0 or group_size <= 0:
        return 0
    return max(1, round(tail_fraction * group_size))


def in_tail(remaining: int, group_size: int, tail_fraction: float) -> bool:
    return 0 < remaining <= tail_size(group_size, tail_fraction)


def threshold_tokens(lam: float, group_max_len: float) -> int:
    """Generated tokens beyond which a tail sample is an outlier (strictly more than lambda x max)."""
    return math.floor(lam * group_max_len) + 1


@dataclass(frozen=True)
class Candidate:
    """A worker that may receive an intra-step migration: it still runs this step's samples."""

    worker: int
    group_rank: int
    outstanding: int


@dataclass(frozen=True)
class Decision:
    kind: Literal["intra-step", "inter-step", "stay"]
    dst: int | None = None


def decide(
    src_worker: int,
    src_rank: int,
    groups: int,
    candidates: Sequence[Candidate],
    inter_step_allowed: bool,
) -> Decision:
    """Where an outlier goes.

    Short groups (lower half of the ranking) prefer intra-step migration, long groups prefer
    inter-step (§6.3). The intra-step destination is a worker of the longest group still running
    (it will run long anyway), the least loaded one among them; never the source worker.
    """
    usable = [c for c in candidates if c.worker != src_worker]
    intra = (
        Decision("intra-step", max(usable, key=lambda c: (c.group_rank, -c.outstanding, -c.worker)).worker)
        if usable
        else None
    )
    prefer_intra = src_rank < groups / 2
    if prefer_intra and intra is not None:
        return intra
    if inter_step_allowed:
        return Decision("inter-step")
    if intra is not None:
        return intra
    return Decision("stay")
