"""Does it pay for tier 2 to know the KV cache? HistoPipe with its cost model given the H100's KV
capacity (as by default) or an unlimited one, both simulated with the real limit (990K tokens a
worker), on synthetic:math with P prompts per step (16 workers, so 16 P / 16 = P responses each).

    .venv/bin/python -P benchmarks/schedule/kv_aware_tier2.py 256 16
    .venv/bin/python -P benchmarks/schedule/kv_aware_tier2.py 512 8
"""

from __future__ import annotations

import dataclasses
import sys

from rhymerl.algorithms.scheduling import RooflineProfile, make_scheduler
from rhymerl.api.scheduling import SchedulingSpec
from rhymerl.tools.sim import SimConfig, simulate
from rhymerl.tools.traces import load_trace

prompts, steps = int(sys.argv[1]), int(sys.argv[2])
trace = load_trace("synthetic:math", prompts_per_step=prompts, num_prompts=8 * prompts)
real = RooflineProfile()
blind = dataclasses.replace(real, hbm_bytes=1e15)  # the scheduler's cost model sees no KV limit
cfg = SimConfig(workers=16, profile=real)
equal = simulate(trace, make_scheduler(SchedulingSpec(policy="equal"), 16, profile=real), cfg, warmup_steps=8,
                 steps=steps)
for name, prof in (("KV-aware tier 2", real), ("KV-blind tier 2", blind)):
    sched = make_scheduler(SchedulingSpec(policy="histopipe", ranking_groups=8), 16, profile=prof)
    r = simulate(trace, sched, cfg, warmup_steps=8, steps=steps)
    print(f"{prompts} per worker, {name}: {r.makespan / steps:.1f} s/step, {equal.makespan / r.makespan:.2f}x over the "
          f"equal split, {r.bound_gap:+.1%} over the bound, {r.preemptions} preemptions")
