"""Build a scheduler from the RLJob spec's `scheduling` block (the one place knobs are read)."""

from __future__ import annotations

from typing import get_args

from rhymerl.api.scheduling import SchedulingSpec

from .base import Scheduler, SchedulerOptions
from .baselines import AsyncRollout, EqualSplit, LongestFirst, Reallocate, SkewAware
from .costmodel import NO_SPECULATION, IterationProfile, SpeculationSpeedup
from .histopipe import HistoPipe, Placement
from .history import LengthHistory

POLICIES: tuple[str, ...] = get_args(SchedulingSpec.model_fields["policy"].annotation)
"""The policies `scheduling.policy` accepts, read from the spec."""


def make_scheduler(
    spec: SchedulingSpec,
    workers: int,
    *,
    profile: IterationProfile | None = None,
    speculation: SpeculationSpeedup = NO_SPECULATION,
    max_off_policy: int = 1,
    seed: int = 0,
    final_round: int | None = None,
    history: LengthHistory | None = None,
    learns_lengths: bool = True,
    placement: Placement = "shared",
) -> Scheduler:
    """The scheduler `spec.policy` names, configured from the spec.

    max_off_policy: the job's `algorithm.max_off_policy_steps` (how far rollout may run ahead of
    training); the async policy uses `scheduling.max_staleness` instead. placement: HistoPipe's
    (`per-worker`: the paper's alternating sub-batches, for benchmarks and ablations).
    """
    common: SchedulerOptions = {
        "profile": profile,
        "speculation": speculation,
        "staleness": max_off_policy,
        "seed": seed,
        "final_round": final_round,
        "history": history,
        "learns_lengths": learns_lengths,
    }
    policy = spec.policy
    if policy == "histopipe":
        return HistoPipe(
            workers,
            groups=spec.ranking_groups,
            two_tier=spec.two_tier,
            first_epoch=spec.first_epoch,
            migration=spec.migration,
            work_stealing=spec.work_stealing,
            placement=placement,
            spread_groups=spec.spread_groups,
            **common,
        )
    if policy == "equal":
        return EqualSplit(workers, **common)
    if policy == "lpt":
        return LongestFirst(workers, **common)
    if policy == "skew-aware":
        return SkewAware(workers, first_epoch=spec.first_epoch, **common)
    if policy == "realloc":
        return Reallocate(workers, **common)
    if policy == "async":
        common["staleness"] = spec.max_staleness
        return AsyncRollout(workers, **common)
    raise ValueError(f"scheduling.policy: unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
