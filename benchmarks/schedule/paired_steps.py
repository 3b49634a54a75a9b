"""What if two consecutive steps shared one weight version? (docs/scheduling.md, "Why 15% is out of reach")

With off-policyness 1, steps 2k+1 and 2k+2 may both roll out on the weights trained through step
2k (2k+1 on-policy, 2k+2 one step stale), so their samples can share every decode iteration: one
weight read serves twice the sequences. The price is a barrier after every pair (the next pair
needs both steps trained) and training no longer overlaps rollout. This replays synthetic:math with
each pair merged into one barrier step (simulator, H100/7B roofline, 16 workers) and reports time
per *original* step against the acceptance run's bound (work / N priced at the even split of one
original step: 70.0 s/step).

    .venv/bin/python -P benchmarks/schedule/paired_steps.py
"""

from __future__ import annotations

import numpy as np

from rhymerl.algorithms.scheduling import RooflineProfile, make_scheduler
from rhymerl.algorithms.scheduling.costmodel import NO_SPECULATION
from rhymerl.api.scheduling import SchedulingSpec
from rhymerl.tools.sim import SimConfig, simulate
from rhymerl.tools.sim.metrics import lower_bound
from rhymerl.tools.traces import Trace, load_trace

N, K, WARMUP, STEPS = 16, 8, 8, 16
tr = load_trace("synthetic:math")
pairs = Trace.build("synthetic:math, step pairs merged", [int((s + 1) // 2) for s in tr.step], list(tr.prompt_id),
                    tr.input_len.tolist(), tr.output_len.tolist())
rows = tr.step_rows()
sim = np.concatenate(rows[WARMUP:WARMUP + STEPS])
bound = lower_bound(tr.input_len[sim], tr.output_len[sim], N, 64, RooflineProfile(), NO_SPECULATION)
per_step_bound = bound.work_per_worker / STEPS
print(f"bound: {per_step_bound:.1f} s per original step (work / N at the even split of one step)")
for policy in ("equal", "lpt", "skew-aware"):
    sched = make_scheduler(SchedulingSpec(policy=policy, ranking_groups=K), N, profile=RooflineProfile())
    r = simulate(pairs, sched, SimConfig(workers=N, profile=RooflineProfile()), warmup_steps=WARMUP // 2,
                 steps=STEPS // 2)
    t = r.makespan / STEPS
    print(f"{policy:>10}, pairs sharing weights: {t:6.1f} s/step, {t / per_step_bound - 1:+.1%} over the bound, "
          f"bubbles {r.bubble_ratio:.1%}, mean batch {r.mean_batch:.1f}")
