"""Rollout over several engine replicas, placed and rebalanced by the production scheduler.

Why: HistoPipe's decisions must be the ones a real run makes, not a simulator-only copy. This
pool drives the same `Scheduler` objects as the simulator (rhymerl/tools/sim/) with real engines:
`plan_step` places a batch's samples on replicas, finishes and watched token counts go back as
events, and the returned `Move`, `Rebalance` and `Watch` actions are carried out on the engines by
the one executor both share (rhymerl/algorithms/scheduling/executor.py, over `_PoolFleet`), a moved sample taking its generated tokens along (position-keyed sampling makes it
continue exactly as it would have where it started).

The local loop trains on a batch only once all its samples finished, and the next batch needs
the weights that training produces, so there is no next step to defer a sample to: every batch is
planned as the scheduler's final step, which makes HistoPipe migrate outliers intra-step (to the
least-loaded replica of the longest group still running) or keep them, never inter-step. A
replica that finished its share is idle for the rest of the batch and offers itself to `on_idle`
(work stealing of samples not started yet).

Replicas share one process and one copy of the weights and are stepped in turn, one pass each
per round, in replica order, so events reach the scheduler in the same order on every run and its
decisions repeat (except `realloc`'s cooldown, which reads the measured time). Each replica's
busy time is its passes timed with a real clock; its timeline is those passes back to back,
except that a replica which had nothing to do and receives a migrated sample cannot start it
before the source replica's time of the move. The makespan is the latest timeline end, the bubble
ratio the idle share of replicas x makespan: what N devices running these passes would see.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.costmodel import TableProfile
from rhymerl.algorithms.scheduling.executor import carry_out, steal
from rhymerl.algorithms.scheduling.types import Action, Move, Sample, SampleId
from rhymerl.workers.rollout.engine import (
    DraftSource,
    EngineSession,
    GenRequest,
    GenResult,
    SamplingParams,
    TorchEngine,
)


class ExecutorError(RuntimeError):
    """The scheduler asked for something this executor cannot do, or the books disagree."""


@dataclass
class PoolReport:
    """What the replicas did for one batch (or, merged, for the batches of one training step)."""

    busy_s: list[float]
    makespan_s: float
    migrated: int = 0
    """Samples moved with their generated tokens (intra-step migrations and rebalanced samples)."""
    stolen: int = 0
    """Samples handed to an idle replica: in-process, ones not started yet (no tokens to carry); between
    Ray rollout workers, unfinished ones with their tokens."""
    ranking: str = "none"

    @property
    def bubble_ratio(self) -> float:
        total = len(self.busy_s) * self.makespan_s
        return max(0.0, 1.0 - sum(self.busy_s) / total) if total > 0 else 0.0

    def merged(self, later: PoolReport) -> PoolReport:
        """Two batches run one after the other (DAPO dynamic sampling's rounds of one step)."""
        return PoolReport([a + b for a, b in zip(self.busy_s, later.busy_s, strict=True)],
                          self.makespan_s + later.makespan_s, self.migrated + later.migrated,
                          self.stolen + later.stolen, self.ranking)

    def metrics(self) -> dict[str, Any]:
        return {
            "rollout_replicas": len(self.busy_s),
            "rollout_busy_s": [round(b, 3) for b in self.busy_s],
            "rollout_makespan_s": round(self.makespan_s, 3),
            "rollout_bubble": round(self.bubble_ratio, 4),
            "rollout_migrated": self.migrated,
            "rollout_stolen": self.stolen,
            "schedule_ranking": self.ranking,
        }


def table_profile(cost: CostProfile, max_batch: int) -> TableProfile:
    """The scheduler's cost model from the engine's measured pass times (rollout/verify_cost.py): the
    one-token column is a decode iteration per batch size; it was measured at one context length,
    so it is taken as constant in context; prefill is priced per token from the longest pass."""
    per_token = cost.seconds[0][-1] / cost.tokens[-1]
    decode = [row[0] for row in cost.seconds]
    if len(cost.batch_sizes) < 2:
        return TableProfile.constant(decode[0], max_batch, per_token)
    return TableProfile(batch_sizes=tuple(cost.batch_sizes), context_lens=(0, 1_000_000),
                        seconds=tuple((t, t) for t in decode), prefill_seconds_per_token=per_token,
                        max_batch=max_batch)


@dataclass
class _Batch:
    """Books of one batch while it runs."""

    step: int
    requests: dict[int, GenRequest]
    sessions: list[EngineSession]
    where: dict[int, int] = field(default_factory=dict)
    watches: dict[int, int] = field(default_factory=dict)
    results: dict[int, GenResult] = field(default_factory=dict)
    shared: deque[int] = field(default_factory=deque)
    clock: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    migrated: int = 0
    stolen: int = 0


class RolloutPool:
    """N engine sessions over one model, driven by `scheduler` (its `workers` is N)."""

    def __init__(self, engine: TorchEngine, scheduler: Scheduler, params: SamplingParams,
                 first_step: int = 1) -> None:
        self.engine = engine
        self.sched = scheduler
        self.params = params
        self.replicas = scheduler.workers
        self.step = first_step - 1
        """The last scheduler step planned: one per batch of requests (a training step may run several)."""
        self._next_sid = 0

    def run(self, requests: list[GenRequest], drafts: Sequence[DraftSource | None] | None = None,
            oracle: Sequence[int] | None = None) -> tuple[list[GenResult], PoolReport]:
        """Generate `requests` on the replicas; results in request order and what the replicas did.

        drafts: one draft source per replica (each keeps per-slot state), or None.
        oracle: each request's true response length, for a policy that plans with perfect
        knowledge (lpt); only a benchmark that ran the requests before knows them.
        """
        n, workers = len(requests), self.replicas
        if drafts is not None and len(drafts) != workers:
            raise ValueError(f"drafts: {len(drafts)} sources for {workers} replicas")
        if oracle is not None and len(oracle) != n:
            raise ValueError(f"oracle: {len(oracle)} lengths for {n} requests")
        self.step += 1
        step = self.step
        sids = list(range(self._next_sid, self._next_sid + n))
        self._next_sid += n
        if not requests:
            return [], PoolReport([0.0] * workers, 0.0)
        longest = max(len(r.prompt_ids) for r in requests)
        sessions = [self.engine.session(self.params, drafts[w] if drafts is not None else None, slots=n,
                                        max_prompt_len=longest) for w in range(workers)]
        b = _Batch(step, dict(zip(sids, requests, strict=True)), sessions, clock=[0.0] * workers,
                   busy=[0.0] * workers)
        samples = [Sample(sid, r.prompt_id or str(sid), len(r.prompt_ids),
                          oracle_len=oracle[i] if oracle is not None else None)
                   for i, (sid, r) in enumerate(b.requests.items())]
        self.sched.final_step = step  # nothing runs after this batch before it trains: no inter-step moves
        plan = self.sched.plan_step(step, samples)
        if plan.carried:
            raise ExecutorError(f"step {step}: the plan carries samples from an earlier batch")
        for w, queue in enumerate(plan.queues):
            for sid in queue:
                sessions[w].add(sid, b.requests[sid])
                b.where[sid] = w
        b.shared.extend(plan.shared)
        share = math.ceil(n / workers)
        while len(b.results) < n:
            progressed = False
            for w in range(workers):
                if self.sched.pipeline == "shared":
                    self._pull(b, w, share)
                if sessions[w].busy:
                    self._pass(b, w)
                    progressed = True
            for w in range(workers):
                if not sessions[w].busy and len(b.results) < n:
                    progressed = self._steal(b, w) or progressed
            if not progressed and len(b.results) < n:
                raise ExecutorError(f"step {step}: {n - len(b.results)} samples are on no replica")
        if self.sched.step_left(step) != 0:
            raise ExecutorError(f"step {step}: the scheduler still counts {self.sched.step_left(step)} samples")
        report = PoolReport(b.busy, max(b.clock), b.migrated, b.stolen, plan.ranking)
        return [b.results[sid] for sid in sids], report

    # ------------------------------------------------------------------ events
    def _pass(self, b: _Batch, w: int) -> None:
        t0 = time.perf_counter()
        finished = b.sessions[w].step()
        dt = time.perf_counter() - t0
        b.busy[w] += dt
        b.clock[w] += dt
        for sid, res in finished:  # off the books first, so no action below can pick a sample that just ended
            if sid in b.results:
                raise ExecutorError(f"sample {sid}: finished twice")
            b.results[sid] = res
            b.watches.pop(sid, None)
            del b.where[sid]
        for sid, res in finished:
            self._apply(b, self.sched.on_sample_finished(sid, w, len(res.response_ids), b.clock[w]))
        self._progress(b, w)

    def _progress(self, b: _Batch, w: int) -> None:
        """Report watched samples on replica w that reached their token count."""
        session = b.sessions[w]
        for sid, tokens in list(b.watches.items()):
            if b.where.get(sid) == w and sid in b.watches and session.generated(sid) >= tokens:
                del b.watches[sid]
                self._apply(b, self.sched.on_progress(sid, w, session.generated(sid), b.clock[w]))

    def _pull(self, b: _Batch, w: int, share: int) -> None:
        """Shared pipeline: replica w takes samples from the shared queue up to its share."""
        session = b.sessions[w]
        while b.shared and len(session.running()) + len(session.waiting()) < share:
            sid = b.shared.popleft()
            self.sched.on_admitted(sid, w)
            session.add(sid, b.requests[sid])
            b.where[sid] = w

    def _steal(self, b: _Batch, w: int) -> bool:
        """Idle replica w asks for samples of this batch that other replicas have not started."""
        moves = steal(self.sched, _PoolFleet(self, b), w, b.step)
        b.stolen += len(moves)
        return bool(moves)

    def _apply(self, b: _Batch, actions: list[Action]) -> None:
        carry_out(self.sched, _PoolFleet(self, b), actions)


class _PoolFleet:
    """The replicas of one batch as the executor's `Fleet` (rhymerl.algorithms.scheduling.executor).
    A moved sample keeps its tokens and is prefilled again on its new replica (recompute): the
    replicas share no KV cache."""

    def __init__(self, pool: RolloutPool, b: _Batch) -> None:
        self.pool = pool
        self.b = b

    def watch(self, sid: SampleId, tokens: int) -> None:
        b = self.b
        if sid in b.where:
            b.watches[sid] = tokens
            self.pool._progress(b, b.where[sid])

    def move(self, sid: SampleId, src: int | None, dst: int | None, generated: int | None, recompute: bool) -> Move:
        b = self.b
        if dst is None:
            raise ExecutorError(f"sample {sid}: inter-step move, but the local loop runs one step at a time")
        if src is None or b.where.get(sid) != src:
            raise ExecutorError(f"sample {sid}: moved from replica {src}, but it is on {b.where.get(sid)}")
        have = b.sessions[src].generated(sid)
        if generated is not None and have != generated:
            raise ExecutorError(f"sample {sid}: the scheduler moved it at {generated} tokens, the engine has {have}")
        if not b.sessions[dst].busy:
            b.clock[dst] = max(b.clock[dst], b.clock[src])  # an idle replica cannot start it earlier
        b.sessions[dst].add(sid, b.requests[sid], b.sessions[src].take(sid), first=True)
        b.where[sid] = dst
        b.watches.pop(sid, None)
        b.migrated += 1
        return Move(sid=sid, src=src, dst=dst, generated=have, recompute=True)

    def waiting(self, worker: int) -> Sequence[SampleId]:
        return self.b.sessions[worker].waiting()

    def running(self, worker: int) -> Sequence[SampleId]:
        return self.b.sessions[worker].running()

    def generated(self, sid: SampleId) -> int:
        return self.b.sessions[self.b.where[sid]].generated(sid)

    def unstarted(self, worker: int, step: int) -> Sequence[SampleId]:
        session = self.b.sessions[worker]
        return [sid for sid in session.waiting() if session.generated(sid) == 0]

    def hand_over(self, move: Move) -> None:
        b = self.b
        assert move.dst is not None
        b.sessions[move.dst].add(move.sid, b.requests[move.sid], b.sessions[move.src].take(move.sid))
        b.where[move.sid] = move.dst
