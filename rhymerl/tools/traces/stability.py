"""Cross-epoch rank stability of response lengths: how well last epoch predicts this one.

Measured as RhymeRL §6.1 / Fig. 9 describe it: rank the prompts by their GRPO group's median
length into K equal ranking groups in two consecutive visits (epochs); a prompt's responses are
"accurate" when its group did not move up. Reported as a share of responses. RhymeRL's table
in §6.3 gives 85.7% (Math-1) down to 71.8% (Code-1) with 8 groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import Trace


@dataclass(frozen=True)
class StabilityReport:
    groups: int
    accurate: float
    """Share of responses whose prompt stayed in its ranking group or moved down."""
    moved_up: float
    pairs: int
    """Consecutive-epoch pairs measured."""
    responses: int


def _visits(trace: Trace) -> dict[str, list[tuple[int, float, int]]]:
    """Per prompt, each step it appears in: (step, median length, responses)."""
    out: dict[str, list[tuple[int, float, int]]] = {}
    for rows in trace.step_rows():
        if rows.size == 0:
            continue
        step = int(trace.step[rows[0]])
        per: dict[str, list[int]] = {}
        for i in rows.tolist():
            per.setdefault(trace.prompt_id[i], []).append(int(trace.output_len[i]))
        for pid, lens in per.items():
            out.setdefault(pid, []).append((step, float(np.median(lens)), len(lens)))
    return out


def _groups_of(medians: np.ndarray, k: int) -> np.ndarray:
    order = np.argsort(medians, kind="stable")
    group = np.empty(len(medians), dtype=np.int64)
    for g, part in enumerate(np.array_split(order, k)):
        group[part] = g
    return group


def rank_stability(trace: Trace, groups: int = 8) -> StabilityReport:
    """Rank stability between each prompt's consecutive visits (epoch e-1 -> e)."""
    if trace.ids != "stable":
        raise ValueError(f"{trace.name}: rank stability needs prompt ids that recur across steps ({trace.ids} ids)")
    visits = _visits(trace)
    max_epochs = max((len(v) for v in visits.values()), default=0)
    accurate = moved = pairs = 0
    for e in range(1, max_epochs):
        pids = [p for p, v in visits.items() if len(v) > e]
        if len(pids) < groups:
            continue
        prev = np.array([visits[p][e - 1][1] for p in pids])
        cur = np.array([visits[p][e][1] for p in pids])
        weight = np.array([visits[p][e][2] for p in pids])
        up = _groups_of(cur, groups) > _groups_of(prev, groups)
        moved += int(np.sum(weight[up]))
        accurate += int(np.sum(weight[~up]))
        pairs += 1
    total = accurate + moved
    return StabilityReport(
        groups=groups,
        accurate=accurate / total if total else float("nan"),
        moved_up=moved / total if total else float("nan"),
        pairs=pairs,
        responses=total,
    )
