"""How many rollout workers the next step wants: a pure policy for autoscalers to act on (the
controller exports it as `fleet_recommended` in metrics.jsonl, the Prometheus gauge
`rhymerl_rollout_workers_recommended` and status.progress.recommendedRolloutWorkers).

The step's work is predicted from the length history (each prompt's last group, spread over its
quantiles as HistoPipe predicts; the prompts never seen share the quantiles of the latest lengths of
all prompts, which is all a job whose prompt ids never recur has) and priced
on n workers with the tier-2 cost model (`group_decode_time`: longest first over n continuous
batches, RhymeRL §6.4), calibrated by what the last step measured: k = its measured makespan over
what the model predicts for its own lengths on the workers it had. Then:

- efficiency: among the sizes whose parallel efficiency T(1) / (n T(n)) is at least `efficiency`
  (0.5 by default: n workers must be at least half as fast again as a perfect split would make
  them), the smallest that reaches the shortest rollout of them all (a worker that shortens
  nothing is not wanted);
- the pipeline: with rollout overlapping training (`max_off_policy_steps >= 1`) a step takes the
  longer of the two, so workers beyond the smallest n whose calibrated rollout fits in the last
  measured training time buy nothing;
- bounds: within the job's min_replicas and max_replicas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .costmodel import NO_SPECULATION, IterationProfile, SpeculationSpeedup, group_decode_time
from .history import LengthHistory


@dataclass(frozen=True)
class FleetAdvice:
    workers: int
    reason: str  # which rule decided: "efficiency", "training", "bounds", "no history"
    predicted_s: dict[int, float] = field(default_factory=dict)  # calibrated rollout seconds by fleet size


def predicted_lengths(history: LengthHistory, prompts: Sequence[str], group_size: int) -> np.ndarray:
    """Each sample's predicted response length: its prompt's last group at quantiles (HistoPipe's
    rule); for a prompt without history, the latest lengths of every prompt (`LengthHistory.recent`)
    at quantiles spread over all such samples, so a step of new prompts keeps the tail that decides
    its makespan (the mean would not); empty if nothing was seen."""
    pool = history.recent()
    if pool.size == 0 or not prompts:
        return np.zeros(0)
    seen = [history.lengths(p) for p in prompts]
    q = (np.arange(group_size, dtype=np.float64) + 0.5) / group_size
    new = sum(h is None for h in seen) * group_size
    spread = iter(np.quantile(pool, (np.arange(new, dtype=np.float64) + 0.5) / new).reshape(-1, group_size)
                  if new else ())
    return np.concatenate([np.quantile(h, q) if h is not None else next(spread) for h in seen])


def recommend(lengths: np.ndarray, input_len: float, profile: IterationProfile, bounds: tuple[int, int], *,
              speculation: SpeculationSpeedup = NO_SPECULATION, efficiency: float = 0.5,
              calibration: float = 1.0, train_s: float | None = None, current: int | None = None) -> FleetAdvice:
    """The fleet size for a step of samples with these predicted `lengths` (module docstring).
    calibration: measured over predicted rollout time of the last step (1.0 without one); train_s:
    the last training time when rollout overlaps training (None when it does not); current: the
    fleet's size now, kept while nothing predicts (the bounds' minimum without it)."""
    lo, hi = bounds
    if not 1 <= lo <= hi:
        raise ValueError(f"bounds: need 1 <= min <= max, got {bounds}")
    if not 0.0 < efficiency <= 1.0:
        raise ValueError("efficiency: in (0, 1]")
    if lengths.size == 0:
        return FleetAdvice(lo if current is None else min(max(current, lo), hi), "no history")
    times = {n: calibration * group_decode_time(lengths, input_len, n, profile, speculation)
             for n in range(1, hi + 1)}
    one = times[1]
    useful = [n for n in range(1, hi + 1) if one > 0 and one / (n * times[n]) >= efficiency] or [1]
    fastest = min(times[n] for n in useful)
    best, reason = min(n for n in useful if times[n] <= fastest * (1 + 1e-9)), "efficiency"
    if train_s is not None:
        enough = [n for n in range(1, best + 1) if times[n] <= train_s]
        if enough and enough[0] < best:
            best, reason = enough[0], "training"
    if not lo <= best <= hi:
        best, reason = min(max(best, lo), hi), "bounds"
    return FleetAdvice(best, reason, {n: round(t, 4) for n, t in times.items() if lo <= n <= hi})


def calibration(rounds: Sequence[tuple[float, np.ndarray, int]], input_len: float, profile: IterationProfile,
                speculation: SpeculationSpeedup = NO_SPECULATION) -> float:
    """Measured over predicted rollout time of the rounds of a step that ran, each given as (its
    measured makespan, its responses' lengths, the workers it had): how far the cost model is off on
    this machine (1.0 when either is zero)."""
    measured = sum(seconds for seconds, _, _ in rounds)
    predicted = sum(group_decode_time(lengths, input_len, max(1, workers), profile, speculation)
                    for _, lengths, workers in rounds)
    return measured / predicted if predicted > 0 and measured > 0 else 1.0
