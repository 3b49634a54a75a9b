"""Estimate the best time per step of the class of schedules HistoPipe belongs to (docs/scheduling.md).

Class: each step's 8 ranking groups (by the *true* median length: perfect prediction) run on
disjoint worker sets, a worker runs one step's sub-batch at a time (one weight version), and with
off-policyness 1 step s+2 cannot start before step s ends, so every group's completion time t_g(n)
must fit in two steps' time 2T, and the step's worker-seconds sum_g n_g t_g(n_g) must fit in N T.
The smallest such T (scanned) ignores packing, prefill and prediction error: an optimistic estimate
for the class, not a lower bound for every conceivable schedule.

    .venv/bin/python benchmarks/schedule/structural_floor.py
"""

from __future__ import annotations

import numpy as np

from rhymerl.algorithms.scheduling.costmodel import NO_SPECULATION, RooflineProfile, group_decode_time
from rhymerl.tools.sim.metrics import lower_bound
from rhymerl.tools.traces import load_trace

N, K = 16, 8
tr = load_trace("synthetic:math")
prof = RooflineProfile()
rows = tr.step_rows()
pids = np.asarray(tr.prompt_id)
floors, bounds = [], []
for s in range(9, 25):
    idx = rows[s - 1]
    out, inp, pid = tr.output_len[idx].astype(float), tr.input_len[idx].astype(float), pids[idx]
    med = {p: float(np.median(out[pid == p])) for p in set(pid.tolist())}
    groups = np.array_split(np.asarray(sorted(med, key=lambda p: med[p]), dtype=object), K)
    cost = np.array([[group_decode_time(np.concatenate([out[pid == p] for p in g]), float(inp.mean()), n, prof)
                      for n in range(1, N + 1)] for g in groups])
    best = np.inf
    for t in np.arange(40.0, 200.0, 0.25):
        ok = cost <= 2 * t
        if not ok.any(axis=1).all():
            continue
        work = sum(float(np.min(np.where(ok[g], cost[g] * np.arange(1, N + 1), np.inf))) for g in range(K))
        if work <= N * t:
            best = t
            break
    lb = lower_bound(tr.input_len[idx], tr.output_len[idx], N, 64, prof, NO_SPECULATION)
    floors.append(best)
    bounds.append(lb.work_per_worker)
    print(f"step {s}: class floor {best:.1f} s, work/N {lb.work_per_worker:.1f} s, floor over bound {best / lb.work_per_worker - 1:+.0%}")
print(f"mean: class floor {np.mean(floors):.1f} s/step, work/N {np.mean(bounds):.1f} s/step, "
      f"floor over bound {np.mean(floors) / np.mean(bounds) - 1:+.1%}")
