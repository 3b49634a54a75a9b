"""Admission, KV cache and preemption on one simulated worker (the rules of scheduling/batching.py),
and the busy segments they open and close.

A worker admits waiting sequences while a slot is free and their KV cache fits; an admission stalls
it for the prefill of what it recomputes; when its cache runs full the sequences admitted last go
back to the front of its queue (vLLM's recompute preemption). engine.py decides when to admit and
from which queue; this module carries it out and keeps the counts.
"""

from __future__ import annotations

import math

from rhymerl.algorithms.scheduling.batching import admits
from rhymerl.algorithms.scheduling.costmodel import IterationProfile

from .state import SeqQueue, SimSeq, SimWorker
from .timing import DecodeModel


class Admission:
    """Sequences on and off workers, with the run's admission, preemption and busy books."""

    def __init__(self, decode: DecodeModel, profile: IterationProfile, cap: int) -> None:
        self.decode = decode
        self.profile = profile
        self.cap = cap
        """Sequences a worker runs at once (engine.Simulator.concurrency)."""
        self.kv_cap = decode.kv_cap
        self.admissions = 0
        self.recompute_tokens = 0
        self.preemptions = 0
        self.step_start: dict[int, float] = {}
        """Per step: its first admission."""
        self.segments: list[tuple[int, float, float, int]] = []
        """Busy spans: worker, start, end, step."""

    # ------------------------------------------------------------------ busy bookkeeping
    def open(self, w: SimWorker, t: float, step: int) -> None:
        """The worker is busy on `step` from `t` (a new segment when the step changes)."""
        if w.busy_since is None:
            w.busy_since = t
            w.seg_step = step
        elif step != w.seg_step:
            self.segments.append((w.idx, w.busy_since, t, w.seg_step))
            w.busy_since = t
            w.seg_step = step

    def close(self, w: SimWorker, t: float) -> None:
        """The worker is idle from `t`."""
        if w.busy_since is not None:
            if t > w.busy_since:
                self.segments.append((w.idx, w.busy_since, t, w.seg_step))
            w.busy_since = None

    # ------------------------------------------------------------------ admission
    def admit(self, w: SimWorker, batch: list[SimSeq], now: float) -> None:
        """Start `batch` on the worker at `now`, after the prefill of what it recomputes."""
        if not batch:
            return
        self.decode.advance(w, now)
        start = w.clock
        tokens = sum(q.input_len + q.generated for q in batch if q.recompute)
        for q in batch:
            if q.generated > 0 and q.recompute:
                self.recompute_tokens += q.input_len + q.generated
        self.open(w, start, batch[-1].step)
        w.clock += self.profile.prefill_time(tokens)
        for q in batch:
            if q.step not in self.step_start:
                self.step_start[q.step] = start
            q.start_it = w.it
            q.where = w.idx
            q.admitted = self.admissions
            self.admissions += 1
            q.running = True
            q.recompute = True
            w.running[q.sid] = q
            w.admitted(q)
            w.c0 += q.input_len + q.generated - q.start_it * w.alpha
            self.decode.track(w, q, w.alpha)

    def remove(self, w: SimWorker, q: SimSeq) -> None:
        """Take a running sequence off its worker, freezing its generated tokens."""
        del w.running[q.sid]
        w.c0 -= q.input_len + q.generated - q.start_it * w.alpha
        q.generated = self.decode.gen_at(q, w.it, w.alpha)
        q.running = False
        q.where = -1
        if not w.running:
            w.c0 = 0.0

    def kv_now(self, w: SimWorker, now: float) -> float:
        """KV tokens the worker holds at `now`: its running sequences' context at the iteration
        `DecodeModel.advance` would bring it to (computed without touching its state)."""
        return w.c0 + len(w.running) * w.alpha * self.decode.reached_it(w, now) if w.running else 0.0

    def fits(self, w: SimWorker, kv: float, q: SimSeq, admitting: int) -> bool:
        """Whether `q` fits next to `kv` tokens of cache for the next iteration, below a 1% watermark
        (vLLM's default; it also keeps a just-preempted sequence from coming straight back). A worker
        with nothing running or being admitted always takes one: a sequence longer than the cache
        runs alone."""
        return admits(kv, q.input_len, q.generated, len(w.running) + admitting + 1, w.alpha, self.kv_cap)

    def take(self, w: SimWorker, queue: SeqQueue, batch: list[SimSeq], kv: float, most: int | None = None) -> float:
        """Move sequences from the front of `queue` into `batch` while a slot is free and their KV
        cache fits next to `kv` tokens (at most `most` of them); returns the KV tokens with them."""
        room = min(self.cap - len(w.running), len(batch) + (most if most is not None else self.cap))
        while queue and len(batch) < room and self.fits(w, kv, queue.first(), len(batch)):
            q = queue.popleft()
            batch.append(q)
            kv += q.input_len + q.generated
        return kv

    def preempt(self, w: SimWorker) -> None:
        """KV cache full: the sequences admitted last go back to the front of the worker's queue,
        keeping their tokens, and are recomputed when readmitted (vLLM's recompute preemption).
        The scheduler is not told: the sample stays on its worker."""
        while len(w.running) > 1 and self.kv_cap < math.inf and self.decode.kv_last_it(w) <= w.it:
            q = w.last_admitted()
            self.remove(w, q)
            q.recompute = True
            w.waiting.appendleft(q)
            self.preemptions += 1

    def reprefill(self, w: SimWorker, now: float) -> None:
        """New weights interrupt the worker: it recomputes the KV cache of everything it runs."""
        self.decode.advance(w, now)
        b = len(w.running)
        tokens = int(w.c0 + b * w.alpha * w.it)
        self.recompute_tokens += tokens
        w.clock += self.profile.prefill_time(tokens)

    def hand_over(self, w: SimWorker, now: float) -> None:
        """Stop every running sequence of the worker at `now`, back to the front of its queue in
        admission order, each to be recomputed."""
        self.decode.advance(w, now)
        for q in sorted(w.running.values(), key=lambda r: -r.admitted):
            self.remove(w, q)
            q.recompute = True
            w.waiting.appendleft(q)
