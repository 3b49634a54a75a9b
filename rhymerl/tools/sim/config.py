"""A simulation's settings, and the error a run that cannot finish raises."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rhymerl.algorithms.scheduling.costmodel import (
    NO_SPECULATION,
    IterationProfile,
    RooflineProfile,
    SpeculationSpeedup,
)
from rhymerl.algorithms.scheduling.freed_drafters import DraftCosts


class SimulationError(RuntimeError):
    """The run cannot finish (a scheduler left samples unplanned or the gates never open)."""


@dataclass(frozen=True)
class SimConfig:
    workers: int
    profile: IterationProfile = field(default_factory=RooflineProfile)
    speculation: SpeculationSpeedup = NO_SPECULATION
    train_time_s: float = 0.0
    """Seconds of training per step after its rollouts complete (0: rollout only)."""
    async_concurrency: int | None = None
    """Shared pipeline: sequences per worker; default the even-split share of a step (the profile's
    max batch for a scheduler that `fills_batch`)."""
    weight_sync_s: float = 0.0
    """Seconds from a step's training end until rollout workers can use the new weights (transfer
    and load); the next training starts without waiting for it."""
    index_bytes_per_token: float = 0.0
    """Serialised history index per token of a prompt's previous responses (0: no history shipping)."""
    bandwidth_bytes_per_s: float = math.inf
    """What one rollout worker receives history indexes at. A step's indexes start shipping when
    the step is planned; a worker taking up its share waits for the rest of its prompts' indexes."""
    freed_drafters: DraftCosts | None = None
    """Workers that hold no sample draft for straggling workers (scheduling/freed_drafters.py),
    priced by these costs; None (the default): off."""
