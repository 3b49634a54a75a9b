"""Discrete-event simulator of rollout workers decoding in continuous batches.

Each worker decodes its running sequences together: one iteration advances every sequence by
`tokens_per_pass` tokens and costs profile.iteration_time(batch, mean context). Between events
(a sequence finishes, a watched sequence reaches its token count, samples are admitted or move)
a worker's batch is constant, so time advances in closed form and the simulator only visits
events: a 16-worker, 1000-sample step is a few thousand heap operations.

The simulator asks a `Scheduler` (the production objects in rhymerl.algorithms.scheduling) for
plans, reports finishes and watched progress, and carries out the returned `Move`, `Rebalance` and
`Watch` actions through the executor the real fleets use (scheduling/executor.py); the simulator
is that executor's `Fleet` (`watch`, `request`, `unfinished`: what they mean in simulated time),
and answers every move at once. Admission, cache overflow and preemption follow
scheduling/batching.py. A worker that finished its share of a step but may not start the next
offers itself to `Scheduler.on_idle` (work stealing: unstarted samples of its step, or started
ones, which it recomputes). Step gating follows the scheduler's pipeline and the off-policy
bound: step s may start only after step s - 1 - staleness trained. The fleet may change while it
runs (spot preemptions, joins, resizing between steps) through `FleetHooks` (elastic.py). With
`SimConfig.freed_drafters`, workers that hold no sample draft for straggling workers
(scheduling/freed_drafters.py decides after every event; a drafted worker's samples go on at the
drafted tokens per pass, its pass priced by the decision's `drafted_pass_seconds`).

Assumptions (docs/scheduling.md): a worker admits sequences while their KV cache fits the
profile's `kv_capacity_tokens` (none: unenforced), and when it runs full the sequences admitted
last are preempted and later recomputed (vLLM's recompute preemption); a
batch admission stalls the worker for the prefill of its tokens; an intra-step migration with
recompute costs the destination a prefill of prompt + generated tokens; a multi-turn sample
leaves its worker for each tool call, dropping its KV cache, and comes back to the queue with its
tokens (`_to_tool`, `_from_tool`); training takes
`train_time_s` per step and runs one step at a time.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.batching import admits, last_fitting_iteration, segment_seconds
from rhymerl.algorithms.scheduling.costmodel import (
    NO_SPECULATION,
    IterationProfile,
    RooflineProfile,
    SpeculationSpeedup,
)
from rhymerl.algorithms.scheduling.executor import Executor
from rhymerl.algorithms.scheduling.freed_drafters import (
    DraftCosts,
    WorkerView,
    assign,
    consolidation,
    drafted_pass_seconds,
)
from rhymerl.algorithms.scheduling.types import Move, RoundPlan, SampleId
from rhymerl.tools.traces.model import Trace

from .drafting import DraftSpan, StepDrafting, step_drafting
from .metrics import SimResult
from .results import collect_result
from .state import SeqQueue, SimSeq, SimWorker, trace_seqs


class SimulationError(RuntimeError):
    """The run cannot finish (a scheduler left samples unplanned or the gates never open)."""


class FleetHooks(Protocol):
    """What changes the fleet while a run goes on (elastic.py: spot preemptions, joins, resizing)."""

    def on_fleet_event(self, sim: Simulator, arg: int) -> None:
        """An event the hooks scheduled (`Simulator.fleet_event`) is due."""

    def between_steps(self, sim: Simulator, trained: int) -> None:
        """Step `trained` has trained; the next step's gate is about to be evaluated."""


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


class Simulator:
    def __init__(self, trace: Trace, scheduler: Scheduler, config: SimConfig, *, warmup_steps: int = 0,
                 steps: int | None = None) -> None:
        if config.workers != scheduler.workers:
            raise ValueError(f"workers: simulator has {config.workers}, scheduler {scheduler.workers}")
        self.trace = trace
        self.sched = scheduler
        self.cfg = config
        self.profile = config.profile
        self.alpha = config.speculation.tokens_per_pass
        self.pass_cost = config.speculation.pass_cost
        rows = trace.step_rows()
        last = trace.num_steps if steps is None else min(trace.num_steps, warmup_steps + steps)
        if warmup_steps >= last:
            raise ValueError(f"warmup_steps: {warmup_steps} leaves no step to simulate (trace has {trace.num_steps})")
        self.first_step = warmup_steps + 1
        self.last_step = last
        self._prime(rows[:warmup_steps])
        self.step_samples, self.seqs = trace_seqs(trace, rows, self.first_step, last)
        self.sched.final_round = last
        n = config.workers
        self.workers = [SimWorker(w, self.first_step - 1, self.alpha) for w in range(n)]
        self.per_step = float(np.mean([len(b) for b in self.step_samples.values()]))
        self.bound_batch = max(1, math.ceil((1 + scheduler.staleness) * self.per_step / n))
        """The lower bound's batch: the even split of the 1 + staleness steps released at once."""
        self.cap = self.concurrency(n)
        kv_cap = self.profile.kv_capacity_tokens
        self.kv_cap = float(kv_cap) if kv_cap is not None else math.inf
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, kind, arg)
        self._counter = 0
        self.plans: dict[int, RoundPlan] = {}
        self.last_plan = self.first_step - 1  # the latest step planned (max of `plans`)
        self.pending: dict[int, list[SeqQueue]] = {}
        """Per step, per worker: planned samples the worker has not taken up yet (it is on an earlier step)."""
        self.round_left: dict[int, int] = {}
        self.completed: dict[int, float] = {}
        self.completed_through = self.first_step - 1
        self.trained_through = self.first_step - 1
        self.train_end = 0.0
        self.step_start: dict[int, float] = {}
        self.idle: set[int] = set(range(n))
        self.shared = SeqQueue(-1)
        self.limbo: set[int] = set()
        self.at_tool: dict[int, int] = {}
        """Multi-turn samples out at a tool call: the worker whose queue they return to (per-worker pipelines)."""
        self.finished: dict[int, tuple[float, int, int]] = {}
        self.segments: list[tuple[int, float, float, int]] = []
        self.migrations: list[tuple[float, int, int, int]] = []
        self.moves_of: dict[int, int] = {}
        self.recompute_tokens = 0
        self.stolen = 0
        self.preemptions = 0
        self.admissions = 0
        self.iterations = 0
        self.seq_iterations = 0
        self.peak_kv = 0.0
        self.now = 0.0
        self.executor = Executor(scheduler, self)
        self.dirty: set[int] = set()
        """Workers whose queues changed while handling the current event (refilled after it)."""
        self.progress: deque[tuple[int, int, int]] = deque()
        """Watched samples that reached their count during the current event: (sample, worker, tokens)."""
        self.plan_time: dict[int, float] = {}
        self.shipped_bytes = 0.0
        self.ship_wait = 0.0
        """Worker-seconds spent waiting for history indexes."""
        self.index_bytes = self._index_sizes(rows) if config.index_bytes_per_token > 0 else {}
        self.gone: set[int] = set()
        """Workers that left the fleet (elastic.py): they take no work; their index stays until compacted."""
        self.hooks: FleetHooks | None = None
        self.draft_costs = config.freed_drafters
        self.drafting: dict[int, int] = {}
        """Drafter -> verifier in force (freed_drafters.assign)."""
        self.draft_spans: list[DraftSpan] = []
        """Every drafter's assignment as it ran: drafter, verifier, start, end."""
        self._draft_since: dict[int, float] = {}
        self.consolidations = 0
        """Workers emptied onto another so that they draft (DraftCosts.consolidate)."""

    # ------------------------------------------------------------------ setup

    def concurrency(self, workers: int) -> int:
        """How many samples a worker runs at once on `workers` workers: the engine's batch limit, or on
        a shared pipeline the configured concurrency, else the even split of a step (AReaL's), unless
        the scheduler fills the engine's batch."""
        if self.sched.pipeline != "shared" or (self.sched.fills_batch and self.cfg.async_concurrency is None):
            return self.profile.max_batch
        return self.cfg.async_concurrency or max(1, math.ceil(self.per_step / max(1, workers)))
    def _index_sizes(self, rows: list[np.ndarray]) -> dict[str, float]:
        """Bytes of each prompt's index: its latest group's response tokens (over the whole trace,
        a stand-in for the previous epoch's) times the bytes per token."""
        tokens: dict[str, float] = {}
        for row in rows:
            group: dict[str, float] = {}
            for i in row.tolist():
                pid = self.trace.prompt_id[i]
                group[pid] = group.get(pid, 0.0) + float(self.trace.output_len[i])
            tokens.update(group)
        return {p: t * self.cfg.index_bytes_per_token for p, t in tokens.items()}

    def _prime(self, rows: list[np.ndarray]) -> None:
        """Warm-up steps are not simulated: their lengths become history, as last epoch's would."""
        for step_rows in rows:
            per: dict[str, list[int]] = {}
            for i in step_rows.tolist():
                per.setdefault(self.trace.prompt_id[i], []).append(int(self.trace.output_len[i]))
            for pid, lens in per.items():
                self.sched.prime(pid, lens)

    # ------------------------------------------------------------------ worker arithmetic
    @staticmethod
    def _passes(tokens: int, alpha: float) -> int:
        if tokens <= 0:
            return 0
        return math.ceil(tokens / alpha - 1e-9)

    @staticmethod
    def _gen_at(q: SimSeq, it: int, alpha: float) -> int:
        return q.generated + min(q.stop - q.generated, math.floor((it - q.start_it) * alpha + 1e-9))

    def _seg_time(self, w: SimWorker, it_to: int) -> float:
        delta = it_to - w.it
        if delta <= 0 or not w.running:
            return 0.0
        if w.drafter is not None:  # its samples' drafts come from a freed worker (freed_drafters.py)
            b = len(w.running)
            return delta * self._drafted_pass(b, (w.c0 + b * w.alpha * (w.it + it_to) / 2.0) / b)
        return segment_seconds(self.profile, len(w.running), w.c0, self.alpha, w.it, it_to) * self.pass_cost

    def _drafted_pass(self, batch: int, context: float) -> float:
        assert self.draft_costs is not None
        return drafted_pass_seconds(self.profile, self.draft_costs, batch, context, self.cfg.speculation)

    def _next_it(self, w: SimWorker) -> int | None:
        while w.fin:
            fit, sid = w.fin[0]
            q = w.running.get(sid)
            if q is not None and q.start_it + self._passes(q.stop - q.generated, w.alpha) == fit:
                break
            heapq.heappop(w.fin)
        while w.wat:
            wit, sid, tok = w.wat[0]
            if self._live_watch(w, wit, sid, tok):
                break
            heapq.heappop(w.wat)
        cands = [h[0][0] for h in (w.fin, w.wat) if h]
        if cands and len(w.running) > 1 and self.kv_cap < math.inf:
            cands.append(max(w.it, self._kv_last_it(w)))
        return min(cands) if cands else None

    def _live_watch(self, w: SimWorker, wit: int, sid: int, tok: int) -> bool:
        """A heap entry is stale once its sequence left the worker, got a new watch, or was
        readmitted (preempted, moved back) and so reaches `tok` at another iteration."""
        q = w.running.get(sid)
        return q is not None and q.watch == tok and q.start_it + self._passes(tok - q.generated, w.alpha) == wit

    def _kv_last_it(self, w: SimWorker) -> int:
        """The last iteration at which the running sequences' KV cache still fits the worker's.
        `_next_it` schedules an event there and `_preempt` acts when it is reached: one expression
        for both, so float rounding cannot make one fire while the other holds back."""
        return last_fitting_iteration(w.c0, len(w.running), w.alpha, self.kv_cap)

    def _schedule(self, w: SimWorker) -> None:
        w.version += 1
        nxt = self._next_it(w)
        if nxt is None:
            return
        t = w.clock + self._seg_time(w, nxt)
        self._push(t, 0, w.idx * (1 << 32) + w.version)

    def _push(self, t: float, kind: int, arg: int) -> None:
        self._counter += 1
        heapq.heappush(self.events, (t, self._counter, kind, arg))

    def _reached_it(self, w: SimWorker, now: float) -> int:
        """The whole iterations a worker has finished by `now`, short of its next event."""
        if not w.running or now <= w.clock:
            return w.it
        nxt = self._next_it(w)
        limit = (nxt - w.it - 1) if nxt is not None else 0
        if limit <= 0:
            return w.it
        b = len(w.running)
        if w.drafter is not None:
            per_it = self._drafted_pass(b, (w.c0 + b * w.alpha * w.it) / b)
        else:
            per_it = self.profile.iteration_time(b, (w.c0 + b * self.alpha * w.it) / b) * self.pass_cost
        return w.it + (min(limit, int((now - w.clock) / per_it)) if per_it > 0 else 0)

    def _advance(self, w: SimWorker, now: float) -> None:
        """Bring a worker's decode state up to `now` (whole iterations; the partial one is spent)."""
        it = self._reached_it(w, now)
        if it > w.it:
            self._step_to(w, it)
        w.clock = max(w.clock, now)

    def _step_to(self, w: SimWorker, it_to: int) -> None:
        """Decode whole iterations up to `it_to`, counting iterations, sequence-iterations and KV peak."""
        delta = it_to - w.it
        if delta <= 0:
            return
        b = len(w.running)
        w.clock += self._seg_time(w, it_to)
        w.it = it_to
        self.iterations += delta
        self.seq_iterations += delta * b
        kv = w.c0 + b * w.alpha * it_to
        if kv > self.peak_kv:
            self.peak_kv = kv

    # ------------------------------------------------------------------ busy bookkeeping
    def _open(self, w: SimWorker, t: float, step: int) -> None:
        if w.busy_since is None:
            w.busy_since = t
            w.seg_step = step
        elif step != w.seg_step:
            self.segments.append((w.idx, w.busy_since, t, w.seg_step))
            w.busy_since = t
            w.seg_step = step

    def _close(self, w: SimWorker, t: float) -> None:
        if w.busy_since is not None:
            if t > w.busy_since:
                self.segments.append((w.idx, w.busy_since, t, w.seg_step))
            w.busy_since = None

    # ------------------------------------------------------------------ admission and steps
    def _admit(self, w: SimWorker, batch: list[SimSeq]) -> None:
        if not batch:
            return
        self._advance(w, self.now)
        start = w.clock
        tokens = sum(q.input_len + q.generated for q in batch if q.recompute)
        for q in batch:
            if q.generated > 0 and q.recompute:
                self.recompute_tokens += q.input_len + q.generated
        self._open(w, start, batch[-1].step)
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
            heapq.heappush(w.fin, (q.start_it + self._passes(q.stop - q.generated, w.alpha), q.sid))
            if q.watch is not None:
                heapq.heappush(w.wat, (q.start_it + self._passes(q.watch - q.generated, w.alpha), q.sid, q.watch))

    def _remove(self, w: SimWorker, q: SimSeq) -> None:
        """Take a running sequence off its worker, freezing its generated tokens."""
        del w.running[q.sid]
        w.c0 -= q.input_len + q.generated - q.start_it * w.alpha
        q.generated = self._gen_at(q, w.it, w.alpha)
        q.running = False
        q.where = -1
        if not w.running:
            w.c0 = 0.0

    def _kv_now(self, w: SimWorker) -> float:
        """KV tokens the worker holds now: its running sequences' context at the iteration `_advance`
        would bring it to (computed without touching its state)."""
        return w.c0 + len(w.running) * w.alpha * self._reached_it(w, self.now) if w.running else 0.0

    def _fits(self, w: SimWorker, kv: float, q: SimSeq, admitting: int) -> bool:
        """Whether `q` fits next to `kv` tokens of cache for the next iteration, below a 1% watermark
        (vLLM's default; it also keeps a just-preempted sequence from coming straight back). A worker
        with nothing running or being admitted always takes one: a sequence longer than the cache
        runs alone."""
        return admits(kv, q.input_len, q.generated, len(w.running) + admitting + 1, w.alpha, self.kv_cap)

    def _take(self, w: SimWorker, queue: SeqQueue, batch: list[SimSeq], kv: float, most: int | None = None) -> float:
        """Move sequences from the front of `queue` into `batch` while a slot is free and their KV
        cache fits next to `kv` tokens (at most `most` of them); returns the KV tokens with them."""
        room = min(self.cap - len(w.running), len(batch) + (most if most is not None else self.cap))
        while queue and len(batch) < room and self._fits(w, kv, queue.first(), len(batch)):
            q = queue.popleft()
            batch.append(q)
            kv += q.input_len + q.generated
        return kv

    def _refill(self, w: SimWorker, most: int | None = None) -> None:
        """Admit waiting work (at most `most` from the shared queue); a worker whose sub-batch is
        done moves on to its next step."""
        if w.idx in self.gone:
            return
        batch: list[SimSeq] = []
        kv = self._take(w, w.waiting, batch, self._kv_now(w) if self.kv_cap < math.inf else 0.0)
        shared = self.sched.pipeline == "shared"
        if shared and not w.waiting:  # in the shared pipeline a worker's own queue holds only its preempted sequences
            taken = len(batch)
            self._take(w, self.shared, batch, kv, most)
            for q in batch[taken:]:
                self.sched.on_admitted(q.sid, w.idx)
        self._admit(w, batch)
        if not shared and not w.running and not w.waiting:
            self._close(w, self.now)
            self._start_next(w)
            return
        if not w.running:
            self._close(w, self.now)
            self.idle.add(w.idx)
        self._schedule(w)

    def _gate(self, step: int) -> bool:
        return step <= self.last_step and self.sched.may_start(step, self.trained_through, self.completed_through)

    def _plan(self, step: int) -> RoundPlan:
        plan = self.sched.plan_round(step, self.step_samples.pop(step))
        self.plans[step] = plan
        self.last_plan = max(self.last_plan, step)
        self.plan_time[step] = self.now
        sids = plan.all_samples()
        self.round_left[step] = len(sids)
        for sid in plan.carried:
            self.limbo.discard(sid)
            self.seqs[sid].step = step
        if self.sched.pipeline == "shared":
            self.shared.extend(self.seqs[sid] for sid in plan.shared)
        else:
            self.pending[step] = [SeqQueue(i, (self.seqs[sid] for sid in q)) for i, q in enumerate(plan.queues)]
        if not sids:
            self._complete(step)
        return plan

    def _start_next(self, w: SimWorker) -> None:
        if w.idx in self.gone:
            return
        while True:
            step = w.step + 1
            if not self._gate(step):
                if not self._steal(w):
                    self.idle.add(w.idx)
                return
            if step not in self.plans:
                self._plan(step)
            w.step = step
            queue = self.pending[step][w.idx]
            if queue:
                self.idle.discard(w.idx)
                self._await_indexes(w, step, queue)
                w.waiting.extend(queue.drain())
                self._refill(w)
                return

    def _await_indexes(self, w: SimWorker, step: int, queue: SeqQueue) -> None:
        """Hold the worker until the history indexes of its share's prompts have arrived."""
        if self.cfg.index_bytes_per_token <= 0 or self.cfg.bandwidth_bytes_per_s == math.inf:
            return
        prompts = {self.trace.prompt_id[q.sid] for q in queue}
        nbytes = sum(self.index_bytes.get(p, 0.0) for p in prompts)
        self.shipped_bytes += nbytes
        ready = self.plan_time[step] + nbytes / self.cfg.bandwidth_bytes_per_s
        self._advance(w, self.now)
        if ready > w.clock:
            self.ship_wait += ready - w.clock
            w.clock = ready

    def _steal(self, w: SimWorker) -> bool:
        """An idle worker that may not start its next step asks the scheduler for unfinished samples
        of the step it just finished (same weights) from other workers; True if it got some."""
        if self.pending.get(w.step) is None or w.running or w.waiting:
            return False
        outer, self.dirty = self.dirty, set()
        moved = self.executor.steal(w.idx, w.step)
        touched, self.dirty = self.dirty, outer
        if not moved:
            return False
        self.stolen += moved
        self.idle.discard(w.idx)
        self._refill(w)
        for idx in sorted(touched - {w.idx}):
            v = self.workers[idx]
            if v.running or v.waiting:  # refilled: it admits what fits now, and runs on
                self._refill(v)
            else:  # it gave away its last unstarted samples: it moves on when the next gate opens
                self.idle.add(idx)
        return True

    def _complete(self, step: int) -> None:
        self.completed[step] = self.now
        while self.completed_through + 1 in self.completed:
            self.completed_through += 1
            self.train_end = max(self.train_end, self.completed[self.completed_through]) + self.cfg.train_time_s
            self._push(self.train_end + self.cfg.weight_sync_s, 1, self.completed_through)
        self._push(self.now, 2, 0)

    def _sample_left(self, step: int) -> None:
        self.round_left[step] -= 1
        if self.round_left[step] == 0:
            self._complete(step)

    # ------------------------------------------------------------------ drafters on freed workers
    def _place_drafters(self) -> None:
        """After an event: the decision (freed_drafters.assign) on the fleet as it stands; a verifier
        whose drafter changed goes on at its new tokens per pass. With `consolidate`, a straggling
        worker left without a drafter is first emptied onto another where the decision says so
        (freed_drafters.consolidation), its samples moved with their tokens. A worker's remaining work
        is predicted from what has run: as many tokens again as its longest-running sample has made,
        at least one (the work-stealing rule's fallback; the simulator does not peek at true lengths)."""
        if self.hooks is not None:
            raise SimulationError("freed drafters: not priced on a fleet that changes while it runs")
        costs = self.draft_costs
        assert costs is not None
        current = self.drafting
        for _ in range(len(self.workers)):  # each consolidation empties a worker: a bounded loop
            freed = [w.idx for w in self.workers if not w.running and not w.waiting and w.idx not in self.gone]
            if not freed and not self.drafting and not costs.consolidate:
                return
            views = self._draft_views(costs) if freed or costs.consolidate else []
            new = assign(views, freed, current, self.profile, costs, self.cfg.speculation)
            merge = consolidation(views, new, self.profile, costs, self.cfg.speculation) if costs.consolidate else None
            if merge is None:
                break
            self._consolidate(*merge)
            current = {**new, merge[0]: merge[1]}  # the emptied worker drafts for the one it filled
        if new == self.drafting:
            return
        old_of = {v: d for d, v in self.drafting.items()}
        new_of = {v: d for d, v in new.items()}
        for d, v in self.drafting.items():
            if new.get(d) != v:
                self.draft_spans.append(DraftSpan(d, v, self._draft_since.pop(d), self.now))
        for d, v in new.items():
            if self.drafting.get(d) != v:
                self._draft_since[d] = self.now
        self.drafting = new
        for v in sorted(set(old_of) | set(new_of)):
            if old_of.get(v) != new_of.get(v):
                self._redraft(self.workers[v], new_of.get(v))

    def _draft_views(self, costs: DraftCosts) -> list[WorkerView]:
        """The workers a drafter could serve, as the decision sees them."""
        views = []
        for w in self.workers:
            b = len(w.running)
            if not 1 <= b <= costs.max_batch or w.waiting or w.idx in self.gone:
                continue
            it = self._reached_it(w, self.now)
            views.append(WorkerView(worker=w.idx, running=b, queued=0, context=(w.c0 + b * w.alpha * it) / b,
                                    remaining=float(max(1, *(self._gen_at(q, it, w.alpha) for q in w.running.values())))))
        return views

    def _consolidate(self, src: int, dst: int) -> None:
        """Move every running sample of `src` to `dst` with its tokens (`dst` recomputes their KV
        cache), through the executor, booked as rebalances."""
        w = self.workers[src]
        self._advance(w, self.now)
        moves = [Move(sid=q.sid, src=src, dst=dst, generated=self._gen_at(q, w.it, w.alpha), recompute=True)
                 for q in sorted(w.running.values(), key=lambda q: q.admitted)]
        outer, self.dirty = self.dirty, set()
        self.executor.consolidate(moves)
        touched, self.dirty = self.dirty, outer
        self.consolidations += 1
        for idx in sorted(touched):
            self._refill(self.workers[idx])

    def _redraft(self, w: SimWorker, drafter: int | None) -> None:
        """The worker's drafts now come from `drafter` (None: its own speculation again). Its running
        sequences keep the whole tokens they have made and go on at the new tokens per pass; the
        pass under way is spent (as for a move)."""
        assert self.draft_costs is not None
        self._advance(w, self.now)
        alpha = self.alpha if drafter is None else max(self.alpha, self.draft_costs.tokens_per_pass)
        for q in w.running.values():
            q.generated = self._gen_at(q, w.it, w.alpha)
            q.start_it = w.it
        w.alpha = alpha
        w.drafter = drafter
        w.c0 = float(sum(q.input_len + q.generated - q.start_it * alpha for q in w.running.values()))
        for q in w.running.values():
            heapq.heappush(w.fin, (q.start_it + self._passes(q.stop - q.generated, alpha), q.sid))
            if q.watch is not None:
                heapq.heappush(w.wat, (q.start_it + self._passes(q.watch - q.generated, alpha), q.sid, q.watch))
        self._schedule(w)

    # ------------------------------------------------------------------ event loop
    def _on_worker(self, w: SimWorker) -> None:
        nxt = self._next_it(w)
        if nxt is None:
            return
        self._step_to(w, nxt)
        self.now = max(self.now, w.clock)
        dirty = self.dirty = {w.idx}
        progress = self.progress = deque()
        done: dict[int, SimSeq] = {}  # heaps may hold stale duplicates of a sequence that moved and came back
        while w.fin and w.fin[0][0] <= w.it:
            _, sid = heapq.heappop(w.fin)
            q = w.running.get(sid)
            if q is not None and q.start_it + self._passes(q.stop - q.generated, w.alpha) <= w.it:
                done[sid] = q
        while w.wat and w.wat[0][0] <= w.it:
            wit, sid, tok = heapq.heappop(w.wat)
            if self._live_watch(w, wit, sid, tok) and sid not in done:
                w.running[sid].watch = None
                progress.append((sid, w.idx, tok))
        for q in [q for q in done.values() if q.stop < q.target]:  # a turn ended: off to its tool
            del done[q.sid]
            self._remove(w, q)
            self._to_tool(q, w.idx)
        for q in done.values():  # off the worker first, so no action below can pick a sequence that just ended
            self._remove(w, q)
            q.generated = q.target
            q.done = True
            self.finished[q.sid] = (self.now, w.idx, q.step)
        for q in done.values():
            self.executor.finished(q.sid, w.idx, q.target, self.now)
            self._sample_left(q.step)
        while progress:
            sid, where, watched = progress.popleft()
            q = self.seqs[sid]
            if q.done or not q.running or q.where != where:
                continue
            self._advance(self.workers[where], self.now)
            gen = self._gen_at(q, self.workers[where].it, self.workers[where].alpha)
            if gen < watched:
                raise AssertionError(f"sample {sid}: progress reported at {gen} tokens, watched for {watched}")
            self.executor.progressed(sid, where, gen, self.now)
        self._preempt(w)
        for idx in sorted(dirty):
            self._refill(self.workers[idx])

    def _preempt(self, w: SimWorker) -> None:
        """KV cache full: the sequences admitted last go back to the front of the worker's queue,
        keeping their tokens, and are recomputed when readmitted (vLLM's recompute preemption).
        The scheduler is not told: the sample stays on its worker."""
        while len(w.running) > 1 and self.kv_cap < math.inf and self._kv_last_it(w) <= w.it:
            q = w.last_admitted()
            self._remove(w, q)
            q.recompute = True
            w.waiting.appendleft(q)
            self.preemptions += 1

    def _on_gate(self, kind: int, arg: int) -> None:
        if kind == 1:
            self.trained_through = max(self.trained_through, arg)
            if self.hooks is not None:
                self.hooks.between_steps(self, arg)
            if self.sched.pipeline == "shared" and self.sched.interrupt_on_update:
                for w in self.workers:
                    if w.running:
                        self._advance(w, self.now)
                        b = len(w.running)
                        tokens = int(w.c0 + b * w.alpha * w.it)
                        self.recompute_tokens += tokens
                        w.clock += self.profile.prefill_time(tokens)
                        self._schedule(w)
        if self.sched.pipeline == "shared":
            step = self.last_plan + 1
            while step in self.step_samples and self._gate(step):
                self._plan(step)
                step += 1
            self._deal()
        else:
            for idx in sorted(self.idle):
                w = self.workers[idx]
                if not w.running and not w.waiting:
                    self.idle.discard(idx)
                    self._start_next(w)

    def _deal(self) -> None:
        """Shared pipeline, steps just released: the queue is dealt one sample at a time round-robin
        over the workers with a free slot (as the rollout fleet deals it), so a queue in the
        scheduler's order (the longest first) spreads over the workers instead of filling one."""
        room = [w for w in self.workers if len(w.running) < self.cap and w.idx not in self.gone]
        while room and self.shared:
            took = []
            for w in room:
                if not self.shared:
                    break
                before = len(w.running)
                self.idle.discard(w.idx)
                self._refill(w, 1)
                if len(w.running) > before and len(w.running) < self.cap and not w.waiting:
                    took.append(w)
            room = took

    def _to_tool(self, q: SimSeq, worker: int) -> None:
        """A turn ended: the sample leaves its worker's batch for its tool call, holding no GPU; its
        KV cache is dropped, so its next turn starts with a prefill of prompt + tokens so far."""
        q.recompute = True
        self.at_tool[q.sid] = worker
        self._push(self.now + q.tool_s[q.turn_ends.index(q.generated)], 4, q.sid)

    def _from_tool(self, sid: int) -> None:
        """The tool answered: the sample re-enters the queue its placement says, at the front (it
        resumes): the shared queue, or its worker's own (a worker that left hands it on)."""
        q = self.seqs[sid]
        worker = self.at_tool.pop(sid)
        if self.sched.pipeline == "shared":
            self.shared.appendleft(q)
            room = [w for w in self.workers if len(w.running) < self.cap and w.idx not in self.gone]
            if room:
                w = min(room, key=lambda v: (len(v.running), v.idx))
                self.idle.discard(w.idx)
                self._refill(w, 1)
            return
        w = self.workers[worker]
        w.waiting.appendleft(q)
        live = [i for i in range(len(self.workers)) if i not in self.gone]
        if worker not in self.gone:
            self.idle.discard(worker)
            self._refill(w)
        elif live:  # as elastic.hand_back does; with nobody live it waits there for a worker to join
            outer, self.dirty = self.dirty, set()
            self.executor.evacuate(worker, q.step, [(q.sid, q.generated)], live)
            touched, self.dirty = self.dirty, outer
            for idx in sorted(touched - self.gone):
                self._refill(self.workers[idx])

    def fleet_event(self, t: float, arg: int) -> None:
        """Have the fleet hooks called with `arg` at time `t`."""
        self._push(t, 3, arg)

    # ------------------------------------------------------------------ the executor's fleet
    def watch(self, sid: SampleId, tokens: int) -> None:
        q = self.seqs[sid]
        if q.done or q.sid in self.limbo:
            return
        q.watch = tokens
        if q.running:
            w = self.workers[q.where]
            self._advance(w, self.now)
            wit = q.start_it + self._passes(tokens - q.generated, w.alpha)
            if wit <= w.it:
                q.watch = None
                self.progress.append((q.sid, q.where, tokens))
            else:
                heapq.heappush(w.wat, (wit, q.sid, tokens))
                self._schedule(w)

    def request(self, move: Move) -> None:
        """Carried out at once: a sample with tokens goes to the front of its destination's queue
        (it resumes), an unstarted one to the back; inter-step, it leaves for the next plan."""
        q = self.seqs[move.sid]
        # a sequence preempted back to its queue has no KV cache left to transfer
        recompute = move.recompute or (not q.running and q.generated > 0)
        origin = self._detach(q)
        if q.generated != move.generated:
            raise AssertionError(f"sample {move.sid}: moved at {move.generated} tokens, the simulator has {q.generated}")
        q.watch = None
        q.recompute = recompute
        if self.executor.in_flight[move.sid].reason in ("migrate", "rebalance"):  # steals are counted apart
            self.migrations.append((self.now, move.sid, origin, -1 if move.dst is None else move.dst))
            self.moves_of[q.step] = self.moves_of.get(q.step, 0) + 1
        self.dirty.add(origin)
        if move.dst is None:
            self.limbo.add(move.sid)
            self._sample_left(q.step)
        else:
            target = self.workers[move.dst]
            self._advance(target, self.now)
            if q.generated > 0:
                target.waiting.appendleft(q)
            else:
                target.waiting.append(q)
            self.idle.discard(move.dst)
            self.dirty.add(move.dst)
        self.executor.confirmed(Move(sid=move.sid, src=origin, dst=move.dst, generated=q.generated,
                                     recompute=recompute))

    def _detach(self, q: SimSeq) -> int:
        """Remove a running, waiting or not yet taken-up sequence from its worker; the worker index."""
        if q.running:
            w = self.workers[q.where]
            self._advance(w, self.now)
            self._remove(w, q)
            return w.idx
        queue = q.queue  # a worker's waiting samples or its planned share of a step not taken up yet
        if queue is None or queue is self.shared:
            raise AssertionError(f"sample {q.sid}: not on any worker")
        queue.remove(q)
        return queue.owner

    def unfinished(self, worker: int, step: int) -> list[tuple[SampleId, int]]:
        """A worker still on an earlier step has not taken up its planned samples of `step` yet."""
        v = self.workers[worker]
        if v.step < step:
            return [(q.sid, q.generated) for q in self.pending[step][worker]]
        if v.step > step:
            return []
        it = self._reached_it(v, self.now)  # read only: asking is not an event of the worker
        return [*((q.sid, q.generated) for q in v.waiting if q.step == step),
                *((q.sid, self._gen_at(q, it, v.alpha)) for q in v.running.values() if q.step == step)]

    def run(self, on_event: Callable[[Simulator], None] | None = None) -> SimResult:
        total = len(self.seqs)
        self._on_gate(2, 0)
        if self.draft_costs is not None:
            self._place_drafters()
        while self.events:
            t, _, kind, arg = heapq.heappop(self.events)
            if kind == 0:
                w = self.workers[arg >> 32]
                if (arg & 0xFFFFFFFF) != w.version:
                    continue
                self.now = max(self.now, t)
                self._on_worker(w)
            elif kind == 4:
                self.now = max(self.now, t)
                self._from_tool(arg)
            elif kind == 3 and self.hooks is not None:
                self.now = max(self.now, t)
                self.hooks.on_fleet_event(self, arg)
            else:
                self.now = max(self.now, t)
                self._on_gate(kind, arg)
            if self.draft_costs is not None:
                self._place_drafters()
            if on_event is not None:
                on_event(self)
        if len(self.finished) != total:
            raise SimulationError(
                f"{self.sched.label}: {total - len(self.finished)} of {total} samples never finished "
                f"(completed through step {self.completed_through}, trained through {self.trained_through})"
            )
        for w in self.workers:
            self._close(w, w.clock)
        for d, v in self.drafting.items():
            self.draft_spans.append(DraftSpan(d, v, self._draft_since.pop(d), self.now))
        self.drafting = {}
        return collect_result(self, total)

    def drafting_report(self) -> list[StepDrafting]:
        """After `run`: per step, the workers that drafted for others and the step's tail (drafting.py)."""
        steps = range(self.first_step, self.last_step + 1)
        finishes: dict[int, list[float]] = {s: [] for s in steps}
        for t, _, st in self.finished.values():
            finishes[st].append(t)
        windows = {s: (self.step_start.get(s, 0.0), self.completed.get(s, 0.0)) for s in steps if finishes[s]}
        return step_drafting(self.draft_spans, windows, finishes)


def simulate(
    trace: Trace,
    scheduler: Scheduler,
    config: SimConfig,
    *,
    warmup_steps: int = 0,
    steps: int | None = None,
    on_event: Callable[[Simulator], None] | None = None,
) -> SimResult:
    """Run `scheduler` over the trace's steps after `warmup_steps` (whose lengths seed history);
    `on_event` is called after every event (e.g. to report progress: `len(sim.finished)` samples done)."""
    return Simulator(trace, scheduler, config, warmup_steps=warmup_steps, steps=steps).run(on_event)
