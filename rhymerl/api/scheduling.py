"""How a step's samples are spread over the rollout workers (HistoPipe and its baselines) and when
long-tail samples migrate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rhymerl.api.blocks import MAX_COEF, NonNegInt, PositiveInt, Probability, Strict


class MigrationSpec(Strict):
    enabled: bool = True
    tail_fraction: Probability = Field(0.1, description="a group's last fraction of running samples that may migrate")
    growth_percentile: float = Field(75.0, ge=0.0, le=100.0, description="percentile of last epoch's growth rates")
    min_lambda: float = Field(1.1, ge=1.0, le=MAX_COEF, description="lower bound of the outlier length factor "
                              f"lambda (at most {MAX_COEF:g})")
    inter_step: bool = Field(True, description="allow deferring outliers to the next step, tokens preserved")


class SchedulingSpec(Strict):
    policy: Literal["histopipe", "equal", "lpt", "skew-aware", "realloc", "async"] = "histopipe"
    ranking_groups: PositiveInt = Field(8, le=1024, description="K ranking groups by historical median length "
                                        "(at most 1024)")
    two_tier: bool = Field(True, description="tier 2: size each ranking group's worker share by its cost")
    first_epoch: Literal["prompt-length", "random"] = Field(
        "prompt-length", description="ranking without history: by prompt length, or a seeded shuffle"
    )
    spread_groups: bool = Field(
        True, description="histopipe, without length history (epoch 1): queue the step's samples sibling by sibling "
        "(each prompt's first sample, then each one's second, ...), so where a step holds more samples than the "
        "engines decode at once a group's earlier samples run ahead and draft for its later ones "
        "(benchmarks/group-drafts/spread); false: each group's samples together"
    )
    migration: MigrationSpec = Field(default_factory=MigrationSpec)
    work_stealing: bool = Field(True, description="histopipe: a rollout replica that finished its share takes "
                                "over samples of a busy one (in-process: samples not started; on Ray workers: "
                                "half of the busiest call's unfinished samples, with their tokens)")
    max_staleness: NonNegInt = Field(1, le=64, description="async: policy versions a sample may lag (at most 64)")
