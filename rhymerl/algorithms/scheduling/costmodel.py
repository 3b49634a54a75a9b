"""Rollout cost model: seconds per decode iteration as a function of batch size and context.

Tier-2 allocation, the skew-aware baseline, the reallocation threshold and the simulator all
price work with the same `IterationProfile`, so a profile measured on the real engine changes
every decision and every simulated number consistently.

The default `RooflineProfile` is a memory-bandwidth roofline, not a measurement: decoding reads
all weights once per iteration plus each sequence's KV cache, and is limited by HBM bandwidth
unless the batch is large enough to be compute bound. Its default numbers describe an H100 SXM
serving a Qwen2.5-7B-shaped model in bf16 (sources in docs/scheduling.md).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from .batching import KV_WATERMARK, admits, last_fitting_iteration, segment_seconds

FloatArray = NDArray[np.float64]


class IterationProfile(Protocol):
    """What every decision and the simulator know about the engine's speed."""

    @property
    def max_batch(self) -> int:
        """Sequences decoded together at most (continuous batching admits more as others finish)."""
        ...

    def iteration_time(self, batch: int, context: float) -> float:
        """Seconds for one decode iteration of `batch` sequences whose mean context is `context` tokens."""
        ...

    def iteration_times(self, batch: FloatArray, context: FloatArray) -> FloatArray:
        """Vectorised `iteration_time`."""
        ...

    def prefill_time(self, tokens: int) -> float:
        """Seconds to prefill (or recompute the KV cache of) `tokens` tokens."""
        ...

    @property
    def kv_capacity_tokens(self) -> int | None:
        """Tokens of KV cache one worker holds (prompt + generated, over its running sequences);
        None: not known, not enforced."""
        ...


@dataclass(frozen=True)
class RooflineProfile:
    """max(memory time, compute time) + a fixed per-iteration overhead.

    memory bytes = weights + batch * context * kv_bytes_per_token; compute = 2 * params * batch FLOPs.
    Defaults: H100 SXM (3.35 TB/s HBM3, 989 TFLOP/s dense bf16) and a Qwen2.5-7B-shaped model
    (7.6e9 parameters in bf16; 28 layers x 4 KV heads x 128 dims x K,V x 2 bytes = 57,344 bytes of
    KV per token). The efficiencies and the overhead are assumptions, not measurements.
    """

    params: float = 7.6e9
    bytes_per_param: float = 2.0
    kv_bytes_per_token: float = 57_344.0
    hbm_bandwidth: float = 3.35e12
    bandwidth_efficiency: float = 0.8
    peak_flops: float = 989e12
    compute_efficiency: float = 0.5
    overhead_s: float = 0.001
    max_batch: int = 256
    hbm_bytes: float = 80e9
    memory_utilization: float = 0.9

    @property
    def kv_capacity_tokens(self) -> int:
        """What is left of `memory_utilization` x HBM after the weights (vLLM's
        gpu_memory_utilization default is 0.9; activations are ignored): 990K tokens by default."""
        free = self.hbm_bytes * self.memory_utilization - self.params * self.bytes_per_param
        return max(1, int(free / self.kv_bytes_per_token))

    @property
    def _bw(self) -> float:
        return self.hbm_bandwidth * self.bandwidth_efficiency

    @property
    def _flops(self) -> float:
        return self.peak_flops * self.compute_efficiency

    def iteration_time(self, batch: int, context: float) -> float:
        mem = (self.params * self.bytes_per_param + batch * context * self.kv_bytes_per_token) / self._bw
        compute = 2.0 * self.params * batch / self._flops
        return max(mem, compute) + self.overhead_s

    def iteration_times(self, batch: FloatArray, context: FloatArray) -> FloatArray:
        mem = (self.params * self.bytes_per_param + batch * context * self.kv_bytes_per_token) / self._bw
        compute = 2.0 * self.params * batch / self._flops
        return np.maximum(mem, compute) + self.overhead_s

    def prefill_time(self, tokens: int) -> float:
        return 2.0 * self.params * tokens / self._flops if tokens > 0 else 0.0


@dataclass(frozen=True)
class TableProfile:
    """A measured grid of seconds per iteration, interpolated bilinearly.

    Outside the grid the edge cells are extrapolated linearly (KV reads grow linearly with
    context and batch), and results are floored at the smallest measured time.
    """

    batch_sizes: tuple[int, ...]
    context_lens: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]  # seconds[i][j] for batch_sizes[i], context_lens[j]
    prefill_seconds_per_token: float
    max_batch: int
    kv_capacity_tokens: int | None = None

    def __post_init__(self) -> None:
        if len(self.batch_sizes) < 2 or len(self.context_lens) < 2:
            raise ValueError("a table profile needs at least 2 batch sizes and 2 context lengths")
        if list(self.batch_sizes) != sorted(set(self.batch_sizes)):
            raise ValueError("batch_sizes must be strictly increasing")
        if list(self.context_lens) != sorted(set(self.context_lens)):
            raise ValueError("context_lens must be strictly increasing")
        object.__setattr__(self, "_grid", np.asarray(self.seconds, dtype=np.float64))
        object.__setattr__(self, "_floor", float(np.min(self._grid)))

    _grid: FloatArray = field(init=False, repr=False, compare=False)
    _floor: float = field(init=False, repr=False, compare=False)

    @classmethod
    def constant(cls, seconds: float = 1.0, max_batch: int = 1024, prefill_seconds_per_token: float = 0.0) -> TableProfile:
        """Every iteration takes `seconds` whatever the batch and context: hand-checkable simulations."""
        return cls(
            batch_sizes=(1, 1_000_000),
            context_lens=(0, 100_000_000),
            seconds=((seconds, seconds), (seconds, seconds)),
            prefill_seconds_per_token=prefill_seconds_per_token,
            max_batch=max_batch,
        )

    @staticmethod
    def _cell(axis: Sequence[int], x: float) -> tuple[int, float]:
        i = bisect.bisect_right(axis, x) - 1
        i = min(max(i, 0), len(axis) - 2)
        frac = (x - axis[i]) / (axis[i + 1] - axis[i])
        return i, frac

    def iteration_time(self, batch: int, context: float) -> float:
        i, fb = self._cell(self.batch_sizes, batch)
        j, fc = self._cell(self.context_lens, context)
        g = self._grid
        top = g[i, j] + (g[i, j + 1] - g[i, j]) * fc
        bottom = g[i + 1, j] + (g[i + 1, j + 1] - g[i + 1, j]) * fc
        return max(float(top + (bottom - top) * fb), self._floor)

    def iteration_times(self, batch: FloatArray, context: FloatArray) -> FloatArray:
        bs = np.asarray(self.batch_sizes, dtype=np.float64)
        cs = np.asarray(self.context_lens, dtype=np.float64)
        i = np.clip(np.searchsorted(bs, batch, side="right") - 1, 0, len(bs) - 2)
        j = np.clip(np.searchsorted(cs, context, side="right") - 1, 0, len(cs) - 2)
        fb = (batch - bs[i]) / (bs[i + 1] - bs[i])
        fc = (context - cs[j]) / (cs[j + 1] - cs[j])
        g = self._grid
        top = g[i, j] + (g[i, j + 1] - g[i, j]) * fc
        bottom = g[i + 1, j] + (g[i + 1, j + 1] - g[i + 1, j]) * fc
        return np.maximum(top + (bottom - top) * fb, self._floor)

    def prefill_time(self, tokens: int) -> float:
        return self.prefill_seconds_per_token * tokens


@dataclass(frozen=True)
class SpeculationSpeedup:
    """Speculative decoding as a speedup model: each forward pass yields `tokens_per_pass` tokens
    per sequence on average (1.0: off) and costs `pass_cost` plain iterations (verification of the
    draft makes a pass slightly dearer)."""

    tokens_per_pass: float = 1.0
    pass_cost: float = 1.0

    def __post_init__(self) -> None:
        if self.tokens_per_pass < 1.0:
            raise ValueError("tokens_per_pass: at least 1 (one token per pass without speculation)")
        if self.pass_cost <= 0.0:
            raise ValueError("pass_cost: must be positive")

    def passes(self, tokens: int) -> int:
        """Forward passes needed to generate `tokens` tokens."""
        return math.ceil(tokens / self.tokens_per_pass - 1e-9) if tokens > 0 else 0


NO_SPECULATION = SpeculationSpeedup()


def worker_decode_time(
    lengths: FloatArray,
    input_len: float,
    profile: IterationProfile,
    spec: SpeculationSpeedup = NO_SPECULATION,
) -> float:
    """Seconds for one worker to decode sequences of these output lengths, queued together.

    Up to `profile.max_batch` decode together; the batch shrinks as they finish: between the i-th
    and (i+1)-th shortest lengths, n - i sequences decode together, at the context they have
    reached then. Beyond `max_batch`, or where their KV cache could outgrow the profile's
    `kv_capacity_tokens`, the worker is walked event by event the way the simulator runs it
    (`walk_decode_time`).
    """
    n = int(lengths.size)
    if n == 0:
        return 0.0
    cap = profile.kv_capacity_tokens
    if n > profile.max_batch or (cap is not None and float(np.sum(lengths)) + n * input_len > cap):
        return walk_decode_time(np.sort(lengths.astype(np.float64))[::-1], input_len, profile, spec)
    ls = np.sort(lengths.astype(np.float64))
    prev = np.concatenate(([0.0], ls[:-1]))
    delta = (ls - prev) / spec.tokens_per_pass
    active = np.arange(n, 0, -1, dtype=np.float64)
    ctx = input_len + (ls + prev) / 2.0
    keep = delta > 0
    if not np.any(keep):
        return 0.0
    times = profile.iteration_times(active[keep], ctx[keep])
    return float(np.sum(delta[keep] * times)) * spec.pass_cost


def walk_decode_time(queue: FloatArray, input_len: float, profile: IterationProfile, spec: SpeculationSpeedup) -> float:
    """Continuous batching of `queue` (admission order) on one worker, with the simulator's rules
    (batching.py: admission under the watermark, recompute preemption of the sequence admitted
    last, constant-batch segments). First admissions' prefill is left out, as in the closed form.
    Vectorised where the KV cache cannot constrain the batch (`_fifo_decode_time`), else walked
    event by event (`event_walk`); both give the same seconds."""
    alpha = spec.tokens_per_pass
    cap = math.inf if profile.kv_capacity_tokens is None else float(profile.kv_capacity_tokens)
    fast = _fifo_decode_time(queue, input_len, profile, alpha, cap)
    return fast * spec.pass_cost if fast is not None else event_walk(queue, input_len, profile, spec)


def event_walk(queue: FloatArray, input_len: float, profile: IterationProfile, spec: SpeculationSpeedup) -> float:
    """`walk_decode_time` event by event, whatever the cache does."""
    alpha = spec.tokens_per_pass
    cap = math.inf if profile.kv_capacity_tokens is None else float(profile.kv_capacity_tokens)
    waiting: deque[tuple[float, float]] = deque((float(length), 0.0) for length in queue)  # (length, generated)
    finishes: list[tuple[float, int]] = []  # (finish iteration, id); stale once the id left `running`
    running: dict[int, tuple[float, float, float]] = {}  # id -> (admission iteration, generated then, length)
    admitted: list[int] = []  # ids in admission order; stale entries skipped
    c0 = 0.0  # KV tokens at iteration it = c0 + len(running) * alpha * it
    it = seconds = 0.0
    ident = 0
    while True:
        while waiting and len(running) < profile.max_batch:
            length, gen = waiting[0]
            b = len(running)
            if not admits(c0 + b * alpha * it, input_len, gen, b + 1, alpha, cap):
                break
            waiting.popleft()
            running[ident] = (it, gen, length)
            heapq.heappush(finishes, (it + (length - gen) / alpha, ident))
            admitted.append(ident)
            c0 += input_len + gen - alpha * it
            if gen > 0:
                seconds += profile.prefill_time(int(input_len + gen)) / spec.pass_cost
            ident += 1
        if not running:
            return seconds * spec.pass_cost
        while finishes[0][1] not in running:
            heapq.heappop(finishes)
        b = len(running)
        nxt = finishes[0][0]
        if b > 1 and cap < math.inf:
            nxt = min(nxt, max(it, last_fitting_iteration(c0, b, alpha, cap)))
        if nxt > it:
            seconds += segment_seconds(profile, b, c0, alpha, it, nxt)
            it = nxt
        while finishes and (finishes[0][1] not in running or finishes[0][0] <= it):
            _, done = heapq.heappop(finishes)
            if done in running:
                start, gen, _ = running.pop(done)
                c0 -= input_len + gen - alpha * start
        if not running:
            c0 = 0.0  # no float drift carried into the next admissions
        while cap < math.inf and len(running) > 1 and last_fitting_iteration(c0, len(running), alpha, cap) <= it:
            while admitted[-1] not in running:
                admitted.pop()
            start, gen, length = running.pop(admitted.pop())
            c0 -= input_len + gen - alpha * start
            waiting.appendleft((length, gen + alpha * (it - start)))


def _fifo_decode_time(queue: FloatArray, input_len: float, profile: IterationProfile, alpha: float,
                      cap: float) -> float | None:
    """`walk_decode_time` without the walk where the KV cache never constrains it: `max_batch`
    slots filled in queue order, the segments between finishes priced in one vectorised call and
    summed in the walk's order (the same seconds). None where the cache could block an admission or
    preempt (at some segment's end the cache plus one more pass of the batch passes the watermark):
    only the walk knows what happens then."""
    lengths = np.asarray(queue, dtype=np.float64) / alpha
    slots = min(profile.max_batch, lengths.size)
    start = np.zeros(lengths.size)
    ends = list(lengths[:slots])
    heapq.heapify(ends)
    for i in range(slots, lengths.size):
        start[i] = ends[0]
        heapq.heapreplace(ends, float(ends[0] + lengths[i]))
    finish = start + lengths
    events = np.unique(np.concatenate(([0.0], finish)))
    lo, hi = events[:-1], events[1:]
    by_start, by_finish = np.argsort(start, kind="stable"), np.argsort(finish, kind="stable")
    offset = input_len - alpha * start  # each running sequence's share of c0 (KV = c0 + batch * alpha * it)
    admitted = np.searchsorted(start[by_start], lo, side="right")
    left = np.searchsorted(finish[by_finish], lo, side="right")
    batch = (admitted - left).astype(np.float64)
    c0 = (np.concatenate(([0.0], np.cumsum(offset[by_start])))[admitted]
          - np.concatenate(([0.0], np.cumsum(offset[by_finish])))[left])
    if cap < math.inf and np.any((batch > 1) & (c0 + batch * alpha * (hi + 1.0) > cap * (1.0 - KV_WATERMARK))):
        return None
    seconds = (hi - lo) * profile.iteration_times(batch, (c0 + batch * alpha * (lo + hi) / 2.0) / batch)
    return float(np.cumsum(seconds)[-1]) if seconds.size else 0.0


def group_decode_time(
    lengths: FloatArray,
    input_len: float,
    workers: int,
    profile: IterationProfile,
    spec: SpeculationSpeedup = NO_SPECULATION,
) -> float:
    """Estimated completion time of a group of predicted lengths spread over `workers` workers.

    Samples are dealt longest-first in a snake order (a cheap stand-in for LPT), and the group
    finishes when its slowest worker does. This is the profiled t(l, dp) of RhymeRL §6.4, taking
    the whole predicted length distribution rather than one representative length.
    """
    if lengths.size == 0:
        return 0.0
    workers = max(1, min(workers, int(lengths.size)))
    order = np.sort(lengths.astype(np.float64))[::-1]
    rounds = -(-order.size // workers)
    grid = np.zeros(rounds * workers)
    grid[:order.size] = order
    real = np.arange(rounds * workers) < order.size
    lanes, dealt = grid.reshape(rounds, workers), real.reshape(rounds, workers)
    lanes[1::2], dealt[1::2] = lanes[1::2, ::-1].copy(), dealt[1::2, ::-1].copy()  # odd rounds deal back
    counts = dealt.sum(axis=0)
    cap = profile.kv_capacity_tokens
    walked = (counts > profile.max_batch) | (
        (np.sum(lanes, axis=0) + counts * input_len > cap) if cap is not None else np.zeros(workers, dtype=bool))
    slowest = max((worker_decode_time(lanes[:counts[w], w], input_len, profile, spec) for w in np.flatnonzero(walked)),
                  default=0.0)
    if walked.all():
        return slowest
    return max(slowest, float(np.max(_closed_form_lanes(lanes[:, ~walked], input_len, profile, spec))))


def _closed_form_lanes(lanes: FloatArray, input_len: float, profile: IterationProfile,
                       spec: SpeculationSpeedup) -> FloatArray:
    """`worker_decode_time`'s closed form for every column of `lanes` at once (zeros pad the short
    ones: a zero-length sample adds no segment, and the ones before it leave the batch size right)."""
    ls = np.sort(lanes, axis=0)
    prev = np.vstack((np.zeros((1, ls.shape[1])), ls[:-1]))
    delta = (ls - prev) / spec.tokens_per_pass
    active = np.broadcast_to(np.arange(ls.shape[0], 0, -1, dtype=np.float64)[:, None], ls.shape)
    ctx = input_len + (ls + prev) / 2.0
    keep = delta > 0
    cost = np.zeros(ls.shape)
    cost[keep] = delta[keep] * profile.iteration_times(active[keep], ctx[keep])
    out: FloatArray = np.sum(cost, axis=0) * spec.pass_cost
    return out


def token_cost(batch: int, context: float, profile: IterationProfile, spec: SpeculationSpeedup = NO_SPECULATION) -> float:
    """Seconds per generated token for one sequence decoding in a batch of `batch` at `context`."""
    return profile.iteration_time(batch, context) * spec.pass_cost / (batch * spec.tokens_per_pass)


def verify_time(profile: IterationProfile, batch: int, context: float, tokens: int) -> float:
    """Seconds of one pass that verifies `tokens` tokens for each of `batch` sequences at mean
    context `context`: the profile's iteration over batch x tokens positions that read the batch's KV
    cache once, iteration_time(batch * tokens, context / tokens). Under the roofline this is exact
    (weights and KV read once, 2 x params FLOPs per position); a measured table is asked about a
    cell it was measured for as plain decoding (an approximation). tokens = 1: a plain pass."""
    return profile.iteration_time(batch * tokens, context / tokens)


def knee_batch(profile: IterationProfile, context: float, fraction: float = 0.5) -> int:
    """Smallest batch whose throughput reaches `fraction` of the throughput at max_batch.

    RLHFSpec §6.1 calls this the threshold: below it, one more sample raises throughput a lot;
    above it, little. Found on the profile, so a measured profile moves it.
    """
    best = profile.max_batch / profile.iteration_time(profile.max_batch, context)
    for b in range(1, profile.max_batch + 1):
        if b / profile.iteration_time(b, context) >= fraction * best:
            return b
    return profile.max_batch
