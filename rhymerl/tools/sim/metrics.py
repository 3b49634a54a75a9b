"""What a simulated run reports, and the lower bound it is measured against.

Lower bound: max(total work / N, longest sample). A sample's work is its decode time at the
even-split batch size B = ceil((1 + staleness) x samples per step / N), or at a smaller batch
(powers of two) where that is cheaper per token: the off-policy bound releases at most 1 +
staleness steps' samples at once, and where throughput is concave in batch size (the roofline) an
even spread of them is the most efficient way to decode them and the price is the one at B; a measured
profile need not be concave, and a bound must not be beaten by a policy running smaller batches.
The longest sample cannot finish faster than decoding alone (batch 1). Every prompt is prefilled at
least once (a worker decodes nothing while it prefills), so the work also holds the prefill of
every sample's prompt. A multi-turn sample drops its KV cache at each tool call, so the work also
holds the prefill of its context at each later turn, and its time the seconds of its tool calls.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from rhymerl.algorithms.scheduling.costmodel import IterationProfile, SpeculationSpeedup, TableProfile
from rhymerl.tools.traces.model import Turns


@dataclass(frozen=True)
class StepRecord:
    step: int
    samples: int
    """Samples that finished counted toward this step (inter-step migrations count where they finish)."""
    start: float
    """First admission of one of its samples."""
    end: float
    """Its last sample finished."""
    bubble_ratio: float
    """Share of worker-time in [start, end] with nothing running (work of any step counts as busy)."""
    migrations: int
    """Moves of its samples (intra-step, to the next step, reallocation)."""
    work_bound: float = 0.0
    """This step's own samples' work / N (priced as in the lower bound): the step's throughput bound."""
    longest_sample: float = 0.0
    """Its longest sample decoded alone."""

    @property
    def bound(self) -> float:
        """max(work / N, longest sample) for this step alone (what a step run by itself cannot beat)."""
        return max(self.work_bound, self.longest_sample)

    @property
    def makespan(self) -> float:
        return self.end - self.start

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.makespan if self.makespan > 0 else 0.0


def window_bubbles(
    segments: list[tuple[int, float, float, int]], workers: int, windows: list[tuple[float, float]]
) -> list[float]:
    """Idle share of worker-time inside each (start, end) window, from busy segments.

    Each worker's segments are merged into disjoint spans in time order; a window sums, worker by
    worker, the overlap of the spans that reach into it (found by bisection: a run of thousands of
    steps has thousands of windows and spans, and scanning every span for every window was
    quadratic). Spans outside a window add 0.0, so the sum is the one a full scan gives, bit for bit.
    """
    by_worker: dict[int, list[tuple[float, float]]] = {}
    for w, s, e, _ in segments:
        by_worker.setdefault(w, []).append((s, e))
    merged: list[list[tuple[float, float]]] = []
    for w in range(workers):
        spans = sorted(by_worker.get(w, []))
        out: list[tuple[float, float]] = []
        for s, e in spans:
            if out and s <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], e))
            else:
                out.append((s, e))
        merged.append(out)
    ends = [[e for _, e in spans] for spans in merged]  # increasing: the spans are disjoint and sorted
    result = []
    for lo, hi in windows:
        if hi <= lo:
            result.append(0.0)
            continue
        busy = sum(
            max(0.0, min(e, hi) - max(s, lo))
            for spans, end in zip(merged, ends, strict=True)
            for s, e in _reaching(spans, end, lo, hi)
        )
        result.append(min(1.0, max(0.0, 1.0 - busy / (workers * (hi - lo)))))
    return result


def _reaching(spans: list[tuple[float, float]], ends: list[float], lo: float, hi: float) -> list[tuple[float, float]]:
    """The disjoint, time-ordered `spans` (their ends `ends`) that may overlap [lo, hi]: from the
    first ending after `lo` to the last starting before `hi`."""
    first = bisect.bisect_right(ends, lo)
    last = first
    while last < len(spans) and spans[last][0] < hi:
        last += 1
    return spans[first:last]


@dataclass(frozen=True)
class LowerBound:
    seconds: float
    work_per_worker: float
    longest_sample: float
    batch: int


@dataclass
class SimResult:
    policy: str
    workers: int
    steps: list[StepRecord]
    samples: int
    makespan: float
    busy: float
    bubble_ratio: float
    samples_per_s: float
    intra_step: int
    inter_step: int
    rebalanced: int
    migrated_samples: int
    recompute_tokens: int
    mean_batch: float
    """Sequences per decode iteration, averaged over all workers' iterations."""
    peak_kv_tokens: int
    """Largest KV cache (context tokens of running sequences) any worker held; not enforced."""
    lower_bound: LowerBound
    segments: list[tuple[int, float, float, int]] = field(repr=False)
    """(worker, start, end, step) intervals during which a worker had sequences running."""
    migrations: list[tuple[float, int, int, int]] = field(repr=False)
    """(time, sample, source worker, destination worker or -1 for the next step)."""
    finished: dict[int, tuple[float, int, int]] = field(repr=False)
    """sample -> (time, worker, step it counted toward)."""
    rankings: dict[int, str] = field(default_factory=dict)
    stolen: int = 0
    """Unfinished samples an idle worker took over from another worker of the same step (work stealing)."""
    preemptions: int = 0
    """Running sequences sent back to their worker's queue because its KV cache was full."""

    @property
    def migrated_fraction(self) -> float:
        return self.migrated_samples / self.samples if self.samples else 0.0

    @property
    def time_per_step(self) -> float:
        return self.makespan / len(self.steps) if self.steps else 0.0

    def steady_state(self) -> tuple[float, float]:
        """(seconds per step, its lower bound) between the first and the last step's completion.

        Pipelined steps overlap, so one step's span is not its cost; the interval from the first
        step's end to the last step's end covers the other steps' work once each, without the
        pipeline's fill. Its bound is the sum of those steps' work / N (the longest-sample term
        belongs to the run as a whole, not to a completion interval).
        """
        done = sorted(self.steps, key=lambda r: r.end)
        if len(done) < 2:
            return self.time_per_step, self.lower_bound.seconds / max(1, len(self.steps))
        rest = done[1:]
        return (done[-1].end - done[0].end) / len(rest), sum(r.work_bound for r in rest) / len(rest)

    @property
    def steady_gap(self) -> float:
        """Steady-state seconds per step over its bound (0.1 = 10% longer)."""
        t, lb = self.steady_state()
        return t / lb - 1.0 if lb > 0 else 0.0

    @property
    def bound_gap(self) -> float:
        """How far above the lower bound the run is (0.1 = 10% longer)."""
        lb = self.lower_bound.seconds
        return self.makespan / lb - 1.0 if lb > 0 else 0.0

    def summary(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "workers": self.workers,
            "steps": len(self.steps),
            "samples": self.samples,
            "makespan_s": self.makespan,
            "time_per_step_s": self.time_per_step,
            "bubble_ratio": self.bubble_ratio,
            "samples_per_s": self.samples_per_s,
            "intra_step_migrations": self.intra_step,
            "inter_step_migrations": self.inter_step,
            "rebalanced_samples": self.rebalanced,
            "migrated_fraction": self.migrated_fraction,
            "recompute_tokens": self.recompute_tokens,
            "mean_batch": self.mean_batch,
            "peak_kv_tokens": self.peak_kv_tokens,
            "lower_bound_s": self.lower_bound.seconds,
            "lower_bound_work_per_worker_s": self.lower_bound.work_per_worker,
            "lower_bound_longest_sample_s": self.lower_bound.longest_sample,
            "lower_bound_batch": self.lower_bound.batch,
            "gap_to_lower_bound": self.bound_gap,
            "steady_time_per_step_s": self.steady_state()[0],
            "steady_lower_bound_per_step_s": self.steady_state()[1],
            "steady_gap_to_lower_bound": self.steady_gap,
            "stolen_samples": self.stolen,
            "preemptions": self.preemptions,
            "rankings": sorted(set(self.rankings.values())),
            "per_step": [
                {"step": r.step, "samples": r.samples, "start_s": r.start, "end_s": r.end, "makespan_s": r.makespan,
                 "samples_per_s": r.samples_per_s, "bubble_ratio": r.bubble_ratio, "migrations": r.migrations,
                 "work_bound_s": r.work_bound, "longest_sample_s": r.longest_sample, "bound_s": r.bound,
                 "gap_to_step_bound": r.makespan / r.bound - 1.0 if r.bound > 0 else 0.0}
                for r in self.steps
            ],
        }


def reentry_tokens(input_len: NDArray[np.int64], turns: Turns) -> int:
    """Tokens prefilled again when multi-turn samples come back from their tool calls: before each
    turn after the first, the prompt and every token generated so far."""
    count = turns.count()
    row = np.repeat(np.arange(len(count)), count)
    csum = np.concatenate([[0], np.cumsum(turns.tokens)])
    flat = np.arange(len(turns.tokens))
    before = csum[flat] - csum[turns.offsets[row]]
    first = flat == turns.offsets[row]
    return int(np.sum((input_len[row] + before)[~first]))


def lower_bound(
    input_len: NDArray[np.int64],
    output_len: NDArray[np.int64],
    workers: int,
    share: int,
    profile: IterationProfile,
    spec: SpeculationSpeedup,
    turns: Turns | None = None,
) -> LowerBound:
    """max(total work / N, longest sample) for these samples; see the module docstring. Multi-turn
    samples (`turns`, these rows') also prefill their context again at each turn after the first
    (work), and wait for their tool calls (the longest sample's time)."""
    batch = max(1, min(profile.max_batch, share))
    out = output_len.astype(np.float64)
    ctx = input_len.astype(np.float64) + out / 2.0
    passes = np.ceil(out / spec.tokens_per_pass - 1e-9)
    # per-token cost is monotone between the grid points of a measured (bilinear) profile, so its
    # minimum up to B lies on one of them (up to the profile's floor); powers of two stand in for
    # other profiles' grids
    grid = profile.batch_sizes if isinstance(profile, TableProfile) else ()
    candidates = sorted({batch, *(b for b in grid if b <= batch),
                         *(2**k for k in range(batch.bit_length()) if 2**k <= batch)})
    per_pass = np.min([profile.iteration_times(np.full_like(ctx, b), ctx) / b for b in candidates], axis=0)
    work = float(np.sum(passes * per_pass * spec.pass_cost)) + profile.prefill_time(int(input_len.sum()))
    solo = passes * profile.iteration_times(np.ones_like(ctx), ctx) * spec.pass_cost
    if turns is not None:
        work += profile.prefill_time(reentry_tokens(input_len, turns))
        solo = solo + turns.tool_seconds()
    longest = float(np.max(solo)) if solo.size else 0.0
    return LowerBound(
        seconds=max(work / workers, longest), work_per_worker=work / workers, longest_sample=longest, batch=batch
    )
