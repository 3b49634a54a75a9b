"""Would deferring more of the long tail help? Partial rollout through HistoPipe's own migration.

RhymeRL's outlier rule (§6.3) never fires on responses truncated at the 16K cap: their group's
longest historical response is the cap, and lambda >= 1.1. This overrides lambda (the fraction of
that longest response after which a tail sample migrates) and the tail fraction, so that long
responses leave their step part-way, tokens kept, as Kimi-style partial rollout would. Simulator,
H100/7B roofline, synthetic:math, 16 workers, 8 groups, 16 steps after one warm-up epoch.

    .venv/bin/python -P benchmarks/schedule/aggressive_migration.py
"""

from __future__ import annotations

from rhymerl.algorithms.scheduling import RooflineProfile, make_scheduler
from rhymerl.algorithms.scheduling.histopipe import HistoPipe
from rhymerl.api.scheduling import MigrationSpec, SchedulingSpec
from rhymerl.tools.sim import SimConfig, simulate
from rhymerl.tools.traces import load_trace

trace, profile = load_trace("synthetic:math"), RooflineProfile()
for lam, tail in [(None, 0.1), (0.5, 0.1), (0.7, 0.2), (0.3, 0.2), (0.5, 0.3)]:
    sched = make_scheduler(SchedulingSpec(policy="histopipe", ranking_groups=8), 16, profile=profile)
    assert isinstance(sched, HistoPipe)
    if lam is not None:
        sched.migration = MigrationSpec.model_construct(tail_fraction=tail, min_lambda=0.0)  # below the spec's floor on purpose
        sched.history.growth_lambda = lambda percentile, floor, lam=lam: lam  # type: ignore[method-assign]
    r = simulate(trace, sched, SimConfig(workers=16, profile=profile), warmup_steps=8, steps=16)
    label = "paper's rule (lambda >= 1.1, tail 10%)" if lam is None else f"lambda {lam}, tail {tail:.0%}"
    print(f"{label:>40}: {r.makespan / 16:6.1f} s/step, {r.bound_gap:+.1%} over the bound, "
          f"{r.migrated_fraction:.2%} migrated ({r.inter_step} inter-step, {r.intra_step} intra-step)")
