"""Build a scheduler from the RLJob spec's `scheduling` block (the one place knobs are read)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Scheduler, SchedulerOptions
from .baselines import AsyncRollout, EqualSplit, LongestFirst, Reallocate, SkewAware
from .costmodel import NO_SPECULATION, IterationProfile, Speculation
from .histopipe import HistoPipe, MigrationConfig

if TYPE_CHECKING:
    from rhymerl.api.spec import SchedulingSpec

POLICIES = ("histopipe", "equal", "lpt", "skew-aware", "realloc", "async")


def make_scheduler(
    spec: SchedulingSpec,
    workers: int,
    *,
    profile: IterationProfile | None = None,
    speculation: Speculation = NO_SPECULATION,
    max_off_policy: int = 1,
    seed: int = 0,
    final_step: int | None = None,
) -> Scheduler:
    """The scheduler `spec.policy` names, configured from the spec.

    max_off_policy: the job's `algorithm.max_off_policy_steps` (how far rollout may run ahead of
    training); the async policy uses `scheduling.max_staleness` instead.
    """
    common: SchedulerOptions = {
        "profile": profile,
        "speculation": speculation,
        "staleness": max_off_policy,
        "seed": seed,
        "final_step": final_step,
    }
    policy = spec.policy
    if policy == "histopipe":
        m = spec.migration
        return HistoPipe(
            workers,
            groups=spec.ranking_groups,
            two_tier=spec.two_tier,
            first_epoch=spec.first_epoch,
            migration=MigrationConfig(
                enabled=m.enabled,
                tail_fraction=m.tail_fraction,
                growth_percentile=m.growth_percentile,
                min_lambda=m.min_lambda,
                inter_step=m.inter_step,
            ),
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
