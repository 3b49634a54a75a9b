"""Baseline policies, driven by the same events and executor as HistoPipe.

equal      veRL-like synchronous rollout: a seeded shuffle cut into equal chunks, one per worker.
lpt        longest-processing-time-first on the true lengths: a reference no real system has.
skew-aware StreamRL-style: predicted long samples get dedicated workers with smaller batches.
realloc    RLHFSpec §6.1: the equal split, then greedy pairing of overloaded and underloaded
           workers around a throughput threshold, at most every `cooldown` seconds.
async      AReaL-style: workers pull samples from a shared queue across steps, bounded by the
           staleness limit; running samples recompute their KV cache when new weights land.
"""

from __future__ import annotations

from typing import Unpack

import numpy as np

from .base import SampleState, Scheduler, SchedulerOptions, SchedulingError
from .costmodel import group_decode_time, knee_batch
from .histopipe import lpt
from .ranking import FirstEpoch, rank_prompts
from .types import Action, Rebalance, RoundPlan, Sample, SampleId


def _shuffled_prompts(samples: list[Sample], seed: int) -> list[Sample]:
    """Prompts in a seeded random order, each prompt's responses kept together."""
    by_prompt: dict[str, list[Sample]] = {}
    for s in samples:
        by_prompt.setdefault(s.prompt_id, []).append(s)
    keys = list(by_prompt)
    order = np.random.default_rng(seed).permutation(len(keys))
    return [s for i in order for s in by_prompt[keys[i]]]


def _chunks(sids: list[SampleId], workers: int) -> list[list[SampleId]]:
    base, extra = divmod(len(sids), workers)
    out, start = [], 0
    for w in range(workers):
        n = base + (1 if w < extra else 0)
        out.append(sids[start : start + n])
        start += n
    return out


class EqualSplit(Scheduler):
    name = "equal"

    def _plan(self, round_no: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        order = _shuffled_prompts(samples, self.seed + round_no) + carried
        return RoundPlan(round_no=round_no, queues=_chunks([s.sid for s in order], self.workers), ranking="random")


class LongestFirst(Scheduler):
    """LPT on true lengths (token counts): the upper reference with perfect length knowledge."""

    name = "lpt"

    def _plan(self, round_no: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        weights = []
        for s in samples + carried:
            if s.oracle_len is None:
                raise SchedulingError("lpt needs the true output lengths (a simulator-only reference policy)")
            weights.append((s.sid, float(s.oracle_len - s.generated)))
        placed = lpt(weights, list(range(self.workers)))
        return RoundPlan(round_no=round_no, queues=[placed[w] for w in range(self.workers)], ranking="oracle")


class SkewAware(Scheduler):
    """StreamRL-style skewness-aware dispatch: the predicted longest fraction of samples gets its
    own workers, sized with the cost model so both sets finish together. Predictions come from
    history; without history it cannot tell long from short and degrades to an equal split."""

    name = "skew-aware"
    needs_history = True
    fractions: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3)

    def __init__(self, workers: int, *, first_epoch: FirstEpoch = "prompt-length", **kwargs: Unpack[SchedulerOptions]) -> None:
        super().__init__(workers, **kwargs)
        self.first_epoch = first_epoch

    def _plan(self, round_no: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        everything = samples + carried
        by_prompt: dict[str, list[Sample]] = {}
        for s in everything:
            by_prompt.setdefault(s.prompt_id, []).append(s)
        input_len = {p: float(np.mean([s.input_len for s in ss])) for p, ss in by_prompt.items()}
        ranking = rank_prompts(list(by_prompt), input_len, self.history, 1, self.first_epoch, self.seed + round_no)
        if ranking.source != "history" or self.workers < 2:
            order = _shuffled_prompts(everything, self.seed + round_no)
            return RoundPlan(round_no=round_no, queues=_chunks([s.sid for s in order], self.workers), ranking=ranking.source)
        pred = {s.sid: ranking.keys[s.prompt_id] for s in everything}
        ranked = sorted(everything, key=lambda s: -pred[s.sid])
        lengths = np.array([pred[s.sid] for s in ranked], dtype=np.float64)
        mean_in = float(np.mean([s.input_len for s in everything]))
        best: tuple[float, int, int] | None = None  # (predicted time, split index, long workers)
        for frac in self.fractions:
            cut = max(1, round(frac * len(ranked)))
            if cut >= len(ranked):
                continue
            for n_long in range(1, self.workers):
                t = max(
                    group_decode_time(lengths[:cut], mean_in, n_long, self.profile, self.speculation),
                    group_decode_time(lengths[cut:], mean_in, self.workers - n_long, self.profile, self.speculation),
                )
                if best is None or t < best[0]:
                    best = (t, cut, n_long)
        if best is None:
            placed = lpt([(s.sid, pred[s.sid]) for s in ranked], list(range(self.workers)))
        else:
            _, cut, n_long = best
            placed = lpt([(s.sid, pred[s.sid]) for s in ranked[:cut]], list(range(n_long)))
            placed.update(lpt([(s.sid, pred[s.sid]) for s in ranked[cut:]], list(range(n_long, self.workers))))
        return RoundPlan(round_no=round_no, queues=[placed[w] for w in range(self.workers)], ranking="history")


class Reallocate(Scheduler):
    """RLHFSpec sample reallocation (§6.1).

    Starts from the same seeded split as `equal` (RLHFSpec allocates in arrival order; a trace's row
    order is arbitrary, so sharing equal's split isolates what reallocation itself adds).
    threshold: the batch size where a worker's throughput reaches half of its maximum on the
    profile (the knee), at `reference_context`. Workers above it are sources, below it
    destinations; the fullest source pairs with the emptiest destination, and so on, each worker
    at most once per decision; a pair moves min(src - threshold, threshold - dst) samples. KV
    caches are transferred in the background (two-stage migration, §6.2), so moves are free.
    """

    name = "realloc"

    def __init__(
        self,
        workers: int,
        *,
        threshold: int | None = None,
        cooldown_s: float | None = None,
        reference_context: float = 8192.0,
        cooldown_iters: int = 50,
        **kwargs: Unpack[SchedulerOptions],
    ) -> None:
        super().__init__(workers, **kwargs)
        self.threshold = threshold if threshold is not None else knee_batch(self.profile, reference_context)
        if cooldown_s is None:
            cooldown_s = cooldown_iters * self.profile.iteration_time(self.threshold, reference_context)
        self.cooldown_s = cooldown_s
        self._last_decision = -float("inf")

    def _plan(self, round_no: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        order = _shuffled_prompts(samples, self.seed + round_no) + carried
        return RoundPlan(round_no=round_no, queues=_chunks([s.sid for s in order], self.workers), ranking="random")

    def _after_finish(self, st: SampleState, now: float) -> list[Action]:
        if now - self._last_decision < self.cooldown_s or st.round_no is None:
            return []
        round_no = st.round_no
        thr = self.threshold
        counts = {w: self.outstanding(w, round_no) for w in range(self.workers)}
        sources = sorted((w for w, c in counts.items() if c > thr), key=lambda w: -counts[w])
        dests = sorted((w for w, c in counts.items() if c < thr), key=lambda w: counts[w])
        actions: list[Action] = []
        for src, dst in zip(sources, dests, strict=False):
            n = min(counts[src] - thr, thr - counts[dst])
            if n > 0:
                actions.append(Rebalance(src=src, dst=dst, count=n, round_no=round_no))
        if actions:
            self._last_decision = now
        return actions


class AsyncRollout(Scheduler):
    """AReaL-style asynchronous rollout bounded by `staleness` policy versions."""

    name = "async"
    pipeline = "shared"
    interrupt_on_update = True

    def __init__(self, workers: int, *, interrupt_on_update: bool = True, **kwargs: Unpack[SchedulerOptions]) -> None:
        super().__init__(workers, **kwargs)
        self.interrupt_on_update = interrupt_on_update

    def _plan(self, round_no: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        order = _shuffled_prompts(samples, self.seed + round_no) + carried
        return RoundPlan(round_no=round_no, queues=[], shared=[s.sid for s in order], ranking="none")
