"""Tier 1 of HistoPipe: rank a step's prompts by predicted length and lay groups out on workers.

Ranking uses the GRPO group's median length from last epoch (RhymeRL §6.2). Odd steps map the
ranking groups to workers 0..N-1 shortest first, even steps longest first, so a worker that had
short work in one step gets long work in the next and the two steps fill each other's bubbles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .history import LengthHistory

RankSource = Literal["history", "prompt-length", "random"]
FirstEpoch = Literal["prompt-length", "random"]


@dataclass(frozen=True)
class Ranking:
    """Prompt ids per ranking group, group 0 predicted shortest; `keys` are the predicted lengths."""

    groups: list[list[str]]
    keys: dict[str, float]
    source: RankSource
    known: int


def rank_prompts(
    prompt_ids: Sequence[str],
    input_len: Mapping[str, float],
    history: LengthHistory,
    groups: int,
    first_epoch: FirstEpoch,
    seed: int,
) -> Ranking:
    """Split the prompts into `groups` equal ranking groups by predicted response length.

    With history for some prompts, the others get the median of the known predictions (a neutral
    middle rank). With none (first epoch, or a trace whose prompt ids never recur), the
    `first_epoch` policy decides: longer prompts first-guessed to give longer answers, or a seeded
    shuffle (which is what an equal random split amounts to).
    """
    ids = list(prompt_ids)
    if not ids:
        return Ranking(groups=[], keys={}, source="history", known=0)
    medians = {p: history.median(p) for p in ids}
    known_vals = [m for m in medians.values() if m is not None]
    source: RankSource
    if known_vals:
        fill = float(np.median(known_vals))
        keys = {p: (m if m is not None else fill) for p, m in medians.items()}
        source = "history"
    elif first_epoch == "prompt-length":
        keys = {p: float(input_len[p]) for p in ids}
        source = "prompt-length"
    else:
        perm = np.random.default_rng(seed).permutation(len(ids))
        keys = {p: float(r) for p, r in zip(ids, perm, strict=True)}
        source = "random"
    ordered = sorted(ids, key=lambda p: keys[p])  # stable: ties keep arrival order
    k = max(1, min(groups, len(ordered)))
    split = [list(map(str, part)) for part in np.array_split(np.asarray(ordered, dtype=object), k)]
    return Ranking(groups=split, keys=keys, source=source, known=len(known_vals))


def step_order(step: int) -> Literal["ascending", "descending"]:
    """Odd steps map groups shortest-first from worker 0, even steps longest-first (§6.2, Fig. 10)."""
    return "ascending" if step % 2 == 1 else "descending"


def layout(workers_per_group: Sequence[int], step: int) -> list[range]:
    """Contiguous worker ranges per ranking group (index = group), in the step's order."""
    order = range(len(workers_per_group))
    if step_order(step) == "descending":
        order = range(len(workers_per_group) - 1, -1, -1)
    ranges: list[range] = [range(0)] * len(workers_per_group)
    start = 0
    for g in order:
        ranges[g] = range(start, start + workers_per_group[g])
        start += workers_per_group[g]
    return ranges


def equal_share(groups: int, workers: int) -> list[int]:
    """Tier-2 off: workers split evenly over groups, the remainder to the longest groups."""
    base, extra = divmod(workers, groups)
    return [base + (1 if g >= groups - extra else 0) for g in range(groups)]
