"""A finished simulation's measurements, read off the simulator's books (engine.Simulator)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .metrics import SimResult, StepRecord, lower_bound, window_bubbles

if TYPE_CHECKING:
    from .engine import Simulator


def collect_result(self: Simulator, total: int) -> SimResult:
    """What a finished simulation measured: makespan, bubbles, per-step windows and bounds, moves."""
    makespan = max((t for t, _, _ in self.finished.values()), default=0.0)
    busy = sum(e - s for _, s, e, _ in self.segments)
    n = self.cfg.workers
    step_ids = range(self.first_step, self.last_step + 1)
    counts = {s: 0 for s in step_ids}
    for _, _, st in self.finished.values():
        counts[st] += 1
    windows = [(self.step_start.get(s, 0.0), self.completed.get(s, 0.0)) for s in step_ids]
    bubbles = window_bubbles(self.segments, n, windows)
    rows = np.array(sorted(self.seqs), dtype=np.int64)
    step_of = np.array([self.seqs[i].origin for i in rows.tolist()], dtype=np.int64)
    by_step = rows[np.argsort(step_of, kind="stable")]  # each step's rows together, in row order
    bounds = np.searchsorted(np.sort(step_of), [step_ids.start, *(s + 1 for s in step_ids)])
    step_lb = {}
    turns = self.trace.turns
    for i, s in enumerate(step_ids):
        r = by_step[bounds[i]:bounds[i + 1]]
        step_lb[s] = lower_bound(
            self.trace.input_len[r], self.trace.output_len[r], n, self.bound_batch, self.profile, self.cfg.speculation,
            turns.take(r) if turns is not None else None,
        )
    steps = [
        StepRecord(step=s, samples=counts[s], start=lo, end=hi, bubble_ratio=b, migrations=self.moves_of.get(s, 0),
                   work_bound=step_lb[s].work_per_worker, longest_sample=step_lb[s].longest_sample)
        for s, (lo, hi), b in zip(step_ids, windows, bubbles, strict=True)
    ]
    stats = self.sched.stats
    return SimResult(
        policy=self.sched.label,
        workers=n,
        steps=steps,
        samples=total,
        makespan=makespan,
        busy=busy,
        bubble_ratio=min(1.0, max(0.0, 1.0 - busy / (n * makespan))) if makespan > 0 else 0.0,
        samples_per_s=total / makespan if makespan > 0 else 0.0,
        intra_step=stats.intra_step,
        inter_step=stats.inter_step,
        rebalanced=stats.rebalanced,
        migrated_samples=len(stats.migrated_samples),
        recompute_tokens=self.recompute_tokens,
        mean_batch=self.seq_iterations / self.iterations if self.iterations else 0.0,
        peak_kv_tokens=int(self.peak_kv),
        lower_bound=lower_bound(
            self.trace.input_len[rows], self.trace.output_len[rows], n, self.bound_batch, self.profile,
            self.cfg.speculation, turns.take(rows) if turns is not None else None,
        ),
        segments=self.segments,
        migrations=self.migrations,
        finished=self.finished,
        rankings=dict(stats.rankings),
        stolen=stats.stolen,
        preemptions=self.preemptions,
    )
