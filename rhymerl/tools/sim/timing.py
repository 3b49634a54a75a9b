"""The closed-form time model of a worker's decoding (engine.py drives it).

Between events a worker's batch is constant, so where it stands at any time is arithmetic: the
iteration a sequence finishes or reaches a watched count, the seconds a run of iterations costs, the
iterations done by a given time. Nothing here knows the event queue, the scheduler or the fleet; it
only reads and advances a `SimWorker`, and counts the iterations and the KV peak it decoded.
"""

from __future__ import annotations

import heapq
import math

from rhymerl.algorithms.scheduling.batching import last_fitting_iteration, segment_seconds
from rhymerl.algorithms.scheduling.costmodel import IterationProfile, SpeculationSpeedup
from rhymerl.algorithms.scheduling.freed_drafters import DraftCosts, drafted_pass_seconds

from .state import SimSeq, SimWorker


class DecodeModel:
    """A worker's decoding in closed form, and the run's decode counters."""

    def __init__(self, profile: IterationProfile, speculation: SpeculationSpeedup, kv_cap: float,
                 draft_costs: DraftCosts | None) -> None:
        self.profile = profile
        self.speculation = speculation
        self.alpha = speculation.tokens_per_pass
        self.pass_cost = speculation.pass_cost
        self.kv_cap = kv_cap
        self.draft_costs = draft_costs
        self.iterations = 0
        self.seq_iterations = 0
        self.peak_kv = 0.0

    @staticmethod
    def passes(tokens: int, alpha: float) -> int:
        """Passes that make `tokens` tokens at `alpha` tokens per pass."""
        if tokens <= 0:
            return 0
        return math.ceil(tokens / alpha - 1e-9)

    @staticmethod
    def gen_at(q: SimSeq, it: int, alpha: float) -> int:
        """The whole tokens `q` has made by its worker's iteration `it`."""
        return q.generated + min(q.stop - q.generated, math.floor((it - q.start_it) * alpha + 1e-9))

    def seg_time(self, w: SimWorker, it_to: int) -> float:
        """Seconds the worker takes from its iteration to `it_to`."""
        delta = it_to - w.it
        if delta <= 0 or not w.running:
            return 0.0
        if w.drafter is not None:  # its samples' drafts come from a freed worker (freed_drafters.py)
            b = len(w.running)
            return delta * self.drafted_pass(b, (w.c0 + b * w.alpha * (w.it + it_to) / 2.0) / b)
        return segment_seconds(self.profile, len(w.running), w.c0, self.alpha, w.it, it_to) * self.pass_cost

    def drafted_pass(self, batch: int, context: float) -> float:
        assert self.draft_costs is not None
        return drafted_pass_seconds(self.profile, self.draft_costs, batch, context, self.speculation)

    def next_it(self, w: SimWorker) -> int | None:
        """The worker's next event: a finish, a watched count or its KV cache running full."""
        while w.fin:
            fit, sid = w.fin[0]
            q = w.running.get(sid)
            if q is not None and q.start_it + self.passes(q.stop - q.generated, w.alpha) == fit:
                break
            heapq.heappop(w.fin)
        while w.wat:
            wit, sid, tok = w.wat[0]
            if self.live_watch(w, wit, sid, tok):
                break
            heapq.heappop(w.wat)
        cands = [h[0][0] for h in (w.fin, w.wat) if h]
        if cands and len(w.running) > 1 and self.kv_cap < math.inf:
            cands.append(max(w.it, self.kv_last_it(w)))
        return min(cands) if cands else None

    def live_watch(self, w: SimWorker, wit: int, sid: int, tok: int) -> bool:
        """A heap entry is stale once its sequence left the worker, got a new watch, or was
        readmitted (preempted, moved back) and so reaches `tok` at another iteration."""
        q = w.running.get(sid)
        return q is not None and q.watch == tok and q.start_it + self.passes(tok - q.generated, w.alpha) == wit

    def kv_last_it(self, w: SimWorker) -> int:
        """The last iteration at which the running sequences' KV cache still fits the worker's.
        `next_it` schedules an event there and preemption acts when it is reached: one expression
        for both, so float rounding cannot make one fire while the other holds back."""
        return last_fitting_iteration(w.c0, len(w.running), w.alpha, self.kv_cap)

    def reached_it(self, w: SimWorker, now: float) -> int:
        """The whole iterations a worker has finished by `now`, short of its next event."""
        if not w.running or now <= w.clock:
            return w.it
        nxt = self.next_it(w)
        limit = (nxt - w.it - 1) if nxt is not None else 0
        if limit <= 0:
            return w.it
        b = len(w.running)
        if w.drafter is not None:
            per_it = self.drafted_pass(b, (w.c0 + b * w.alpha * w.it) / b)
        else:
            per_it = self.profile.iteration_time(b, (w.c0 + b * self.alpha * w.it) / b) * self.pass_cost
        return w.it + (min(limit, int((now - w.clock) / per_it)) if per_it > 0 else 0)

    def advance(self, w: SimWorker, now: float) -> None:
        """Bring a worker's decode state up to `now` (whole iterations; the partial one is spent)."""
        it = self.reached_it(w, now)
        if it > w.it:
            self.step_to(w, it)
        w.clock = max(w.clock, now)

    def step_to(self, w: SimWorker, it_to: int) -> None:
        """Decode whole iterations up to `it_to`, counting iterations, sequence-iterations and KV peak."""
        delta = it_to - w.it
        if delta <= 0:
            return
        b = len(w.running)
        w.clock += self.seg_time(w, it_to)
        w.it = it_to
        self.iterations += delta
        self.seq_iterations += delta * b
        kv = w.c0 + b * w.alpha * it_to
        if kv > self.peak_kv:
            self.peak_kv = kv

    def ended(self, w: SimWorker) -> tuple[dict[int, SimSeq], list[tuple[int, int, int]]]:
        """At the worker's iteration: the sequences whose run ends there, and the watched ones that
        reached their count (sample, worker, tokens), their watch cleared."""
        done: dict[int, SimSeq] = {}  # heaps may hold stale duplicates of a sequence that moved and came back
        while w.fin and w.fin[0][0] <= w.it:
            _, sid = heapq.heappop(w.fin)
            q = w.running.get(sid)
            if q is not None and q.start_it + self.passes(q.stop - q.generated, w.alpha) <= w.it:
                done[sid] = q
        reached = []
        while w.wat and w.wat[0][0] <= w.it:
            wit, sid, tok = heapq.heappop(w.wat)
            if self.live_watch(w, wit, sid, tok) and sid not in done:
                w.running[sid].watch = None
                reached.append((sid, w.idx, tok))
        return done, reached

    def track(self, w: SimWorker, q: SimSeq, alpha: float) -> None:
        """Put `q`'s finish (and its watched count) on the worker's heaps, from its `start_it` on."""
        heapq.heappush(w.fin, (q.start_it + self.passes(q.stop - q.generated, alpha), q.sid))
        if q.watch is not None:
            heapq.heappush(w.wat, (q.start_it + self.passes(q.watch - q.generated, alpha), q.sid, q.watch))
