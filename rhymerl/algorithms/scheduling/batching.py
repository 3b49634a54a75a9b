"""How one rollout worker batches, as vLLM does it: the rules written once, applied by both the
tier-2 cost model's walk of a worker (costmodel.worker_decode_time) and the simulator's workers
(rhymerl.tools.sim), so the scheduler plans with the engine the simulator runs.

- Continuous batching: a waiting sequence is admitted when a slot is free and its KV cache fits
  below the watermark (`admits`); a worker running nothing always takes one (a sequence longer
  than the cache runs alone).
- KV growth: every running sequence adds `alpha` (tokens per pass) tokens of cache per iteration,
  so a worker's cache at iteration `it` is `c0 + running * alpha * it` for a constant `c0` that
  admissions and departures adjust; `last_fitting_iteration` is when it overflows.
- Recompute preemption: at overflow the sequence admitted last goes back to the front of the queue
  with its tokens and pays a prefill of prompt + tokens when readmitted.
- Between two events the batch is constant; an iteration costs the profile's time at the batch's
  mean context over the segment (`segment_seconds`).
"""

from __future__ import annotations

import math
from typing import Protocol


class IterationTime(Protocol):
    """What a segment's cost needs of an iteration profile (costmodel.IterationProfile has it)."""

    def iteration_time(self, batch: int, context: float) -> float: ...

KV_WATERMARK = 0.01
"""Share of the KV cache kept free at admission (vLLM's default); it also keeps a just-preempted
sequence from coming straight back."""


def admits(kv: float, input_len: float, generated: float, batch_after: int, alpha: float, capacity: float) -> bool:
    """Whether a sequence of `input_len` prompt and `generated` tokens fits next to `kv` tokens of
    cache for the next iteration of a batch of `batch_after` sequences (itself included)."""
    if batch_after <= 1:
        return True
    return kv + input_len + generated + batch_after * alpha <= capacity * (1.0 - KV_WATERMARK)


def last_fitting_iteration(c0: float, running: int, alpha: float, capacity: float) -> int:
    """The last iteration at which `running` sequences' cache (c0 + running * alpha * it) still fits.
    Both the event that stops a worker there and the preemption it triggers use this one expression,
    so float rounding cannot make one fire while the other holds back."""
    return math.floor((capacity - c0) / (running * alpha))


def segment_seconds(profile: IterationTime, running: int, c0: float, alpha: float, it_from: float,
                    it_to: float) -> float:
    """Seconds of the iterations it_from..it_to of a constant batch (pass cost not included)."""
    return (it_to - it_from) * profile.iteration_time(running, (c0 + running * alpha * (it_from + it_to) / 2.0) / running)
