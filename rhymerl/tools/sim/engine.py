"""Discrete-event simulator of rollout workers decoding in continuous batches.

Each worker decodes its running sequences together: one iteration advances every sequence by
`tokens_per_pass` tokens and costs profile.iteration_time(batch, mean context). Between events
(a sequence finishes, a watched sequence reaches its token count, samples are admitted or move)
a worker's batch is constant, so time advances in closed form (timing.py) and the simulator only
visits events: a 16-worker, 1000-sample step is a few thousand heap operations.

The simulator asks a `Scheduler` (the production objects in rhymerl.algorithms.scheduling) for
plans, reports finishes and watched progress, and carries out the returned `Move`, `Rebalance` and
`Watch` actions through the executor the real fleets use (scheduling/executor.py); port.py is
that executor's `Fleet` in simulated time and answers every move at once. Admission, cache
overflow and preemption follow scheduling/batching.py (admission.py). A worker that finished its
share of a step but may not start the next offers itself to `Scheduler.on_idle` (work stealing:
unstarted samples of its step, or started ones, which it recomputes). Step gating follows the
scheduler's pipeline and the off-policy bound: step s may start only after step s - 1 - staleness
trained. The fleet may change while it runs (spot preemptions, joins, resizing between steps)
through `FleetHooks` (elastic.py), which call the simulator's `join`, `leave`, `hand_back` and
`compact` (membership.py). With `SimConfig.freed_drafters`, workers that hold no sample draft for
straggling workers (drafters.py carries out scheduling/freed_drafters.py's decision after every
event; not on a fleet that changes while it runs).

Assumptions (docs/scheduling.md): a worker admits sequences while their KV cache fits the
profile's `kv_capacity_tokens` (none: unenforced), and when it runs full the sequences admitted
last are preempted and later recomputed (vLLM's recompute preemption); a batch admission stalls
the worker for the prefill of its tokens; an intra-step migration with recompute costs the
destination a prefill of prompt + generated tokens; a multi-turn sample leaves its worker for each
tool call, dropping its KV cache, and comes back to the queue with its tokens (tool_calls.py);
training takes `train_time_s` per step and runs one step at a time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.executor import Executor
from rhymerl.algorithms.scheduling.types import RoundPlan
from rhymerl.tools.traces.model import Trace

from .admission import Admission
from .config import SimConfig, SimulationError
from .drafters import FreedDrafters
from .drafting import DraftSpan, StepDrafting, step_drafting
from .events import FLEET, GATE, TOOL, TRAINED, WORKER, EventQueue
from .membership import Membership
from .metrics import SimResult
from .port import ExecutorPort
from .results import collect_result
from .shipping import IndexShipping
from .state import SeqQueue, SimSeq, SimWorker, prime_history, trace_seqs
from .timing import DecodeModel
from .tool_calls import ToolCalls


class FleetHooks(Protocol):
    """What changes the fleet while a run goes on (elastic.py: spot preemptions, joins, resizing)."""

    def on_fleet_event(self, sim: Simulator, arg: int) -> None:
        """An event the hooks scheduled (`Simulator.fleet_event`) is due."""

    def between_steps(self, sim: Simulator, trained: int) -> None:
        """Step `trained` has trained; the next step's gate is about to be evaluated."""


class Simulator:
    """One run: the round driver (plans, gates, refills, steals, the event loop) over the run's
    books, composed with the time model, admission, the executor's port, tool calls, membership and
    (where configured) the freed drafters."""

    def __init__(self, trace: Trace, scheduler: Scheduler, config: SimConfig, *, warmup_steps: int = 0,
                 steps: int | None = None) -> None:
        if config.workers != scheduler.workers:
            raise ValueError(f"workers: simulator has {config.workers}, scheduler {scheduler.workers}")
        self.trace = trace
        self.sched = scheduler
        self.cfg = config
        self.profile = config.profile
        self.alpha = config.speculation.tokens_per_pass
        rows = trace.step_rows()
        last = trace.num_steps if steps is None else min(trace.num_steps, warmup_steps + steps)
        if warmup_steps >= last:
            raise ValueError(f"warmup_steps: {warmup_steps} leaves no step to simulate (trace has {trace.num_steps})")
        self.first_step = warmup_steps + 1
        self.last_step = last
        prime_history(scheduler, trace, rows[:warmup_steps])
        self.step_samples, self.seqs = trace_seqs(trace, rows, self.first_step, last)
        self.sched.final_round = last
        n = config.workers
        self.workers = [SimWorker(w, self.first_step - 1, self.alpha) for w in range(n)]
        self.per_step = float(np.mean([len(b) for b in self.step_samples.values()]))
        self.bound_batch = max(1, math.ceil((1 + scheduler.staleness) * self.per_step / n))
        """The lower bound's batch: the even split of the 1 + staleness steps released at once."""
        kv_cap = self.profile.kv_capacity_tokens
        self.decode = DecodeModel(self.profile, config.speculation, float(kv_cap) if kv_cap is not None else math.inf,
                                  config.freed_drafters)
        self.events = EventQueue(self.decode)
        self.admission = Admission(self.decode, self.profile, self.concurrency(n))
        self._open_books(n)
        self.shipping = IndexShipping(trace, config, self.decode, rows)
        self.port = ExecutorPort(self)
        self.executor = Executor(scheduler, self.port)
        self.tools = ToolCalls(self)
        self.membership = Membership(self)
        self.hooks: FleetHooks | None = None
        costs = config.freed_drafters
        self.drafters = None if costs is None else FreedDrafters(self, costs, self.profile, config.speculation)

    def _open_books(self, n: int) -> None:
        """The run's books before its first event."""
        self.plans: dict[int, RoundPlan] = {}
        self.last_plan = self.first_step - 1  # the latest step planned (max of `plans`)
        self.pending: dict[int, list[SeqQueue]] = {}
        """Per step, per worker: planned samples the worker has not taken up yet (it is on an earlier step)."""
        self.round_left: dict[int, int] = {}
        self.completed: dict[int, float] = {}
        self.completed_through = self.first_step - 1
        self.trained_through = self.first_step - 1
        self.train_end = 0.0
        self.idle: set[int] = set(range(n))
        self.shared = SeqQueue(-1)
        self.limbo: set[int] = set()
        """Samples moved to the next step's plan, on no worker."""
        self.at_tool: dict[int, int] = {}
        """Multi-turn samples out at a tool call: the worker whose queue they return to (per-worker pipelines)."""
        self.finished: dict[int, tuple[float, int, int]] = {}
        self.migrations: list[tuple[float, int, int, int]] = []
        self.moves_of: dict[int, int] = {}
        self.now = 0.0
        self.dirty: set[int] = set()
        """Workers whose queues changed while handling the current event (refilled after it)."""
        self.progress: deque[tuple[int, int, int]] = deque()
        """Watched samples that reached their count during the current event: (sample, worker, tokens)."""
        self.gone: set[int] = set()
        """Workers that left the fleet (membership.py): they take no work; their index stays until compacted."""

    # ------------------------------------------------------------------ setup
    def concurrency(self, workers: int) -> int:
        """How many samples a worker runs at once on `workers` workers: the engine's batch limit, or on
        a shared pipeline the configured concurrency, else the even split of a step (AReaL's), unless
        the scheduler fills the engine's batch."""
        if self.sched.pipeline != "shared" or (self.sched.fills_batch and self.cfg.async_concurrency is None):
            return self.profile.max_batch
        return self.cfg.async_concurrency or max(1, math.ceil(self.per_step / max(1, workers)))

    # ------------------------------------------------------------------ admission and steps
    def refill(self, w: SimWorker, most: int | None = None) -> None:
        """Admit waiting work (at most `most` from the shared queue); a worker whose sub-batch is
        done moves on to its next step."""
        if w.idx in self.gone:
            return
        batch: list[SimSeq] = []
        adm = self.admission
        kv = adm.take(w, w.waiting, batch, adm.kv_now(w, self.now) if adm.kv_cap < math.inf else 0.0)
        shared = self.sched.pipeline == "shared"
        if shared and not w.waiting:  # in the shared pipeline a worker's own queue holds only its preempted sequences
            taken = len(batch)
            adm.take(w, self.shared, batch, kv, most)
            for q in batch[taken:]:
                self.sched.on_admitted(q.sid, w.idx)
        adm.admit(w, batch, self.now)
        if not shared and not w.running and not w.waiting:
            adm.close(w, self.now)
            self._start_next(w)
            return
        if not w.running:
            adm.close(w, self.now)
            self.idle.add(w.idx)
        self.events.schedule(w)

    def _gate(self, step: int) -> bool:
        return step <= self.last_step and self.sched.may_start(step, self.trained_through, self.completed_through)

    def _plan(self, step: int) -> RoundPlan:
        plan = self.sched.plan_round(step, self.step_samples.pop(step))
        self.plans[step] = plan
        self.last_plan = max(self.last_plan, step)
        self.shipping.planned(step, self.now)
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
                self.shipping.await_indexes(w, step, queue, self.now)
                w.waiting.extend(queue.drain())
                self.refill(w)
                return

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
        self.idle.discard(w.idx)
        self.refill(w)
        for idx in sorted(touched - {w.idx}):
            v = self.workers[idx]
            if v.running or v.waiting:  # refilled: it admits what fits now, and runs on
                self.refill(v)
            else:  # it gave away its last unstarted samples: it moves on when the next gate opens
                self.idle.add(idx)
        return True

    def _complete(self, step: int) -> None:
        self.completed[step] = self.now
        while self.completed_through + 1 in self.completed:
            self.completed_through += 1
            self.train_end = max(self.train_end, self.completed[self.completed_through]) + self.cfg.train_time_s
            self.events.push(self.train_end + self.cfg.weight_sync_s, TRAINED, self.completed_through)
        self.events.push(self.now, GATE, 0)

    def sample_left(self, step: int) -> None:
        """A sample of `step` finished or left it for the next step's plan."""
        self.round_left[step] -= 1
        if self.round_left[step] == 0:
            self._complete(step)

    # ------------------------------------------------------------------ event loop
    def _on_worker(self, w: SimWorker) -> None:
        nxt = self.decode.next_it(w)
        if nxt is None:
            return
        self.decode.step_to(w, nxt)
        self.now = max(self.now, w.clock)
        dirty = self.dirty = {w.idx}
        self.progress = deque()
        done, reached = self.decode.ended(w)
        self.progress.extend(reached)
        for q in [q for q in done.values() if q.stop < q.target]:  # a turn ended: off to its tool
            del done[q.sid]
            self.admission.remove(w, q)
            self.tools.leave(q, w.idx)
        for q in done.values():  # off the worker first, so no action below can pick a sequence that just ended
            self.admission.remove(w, q)
            q.generated = q.target
            q.done = True
            self.finished[q.sid] = (self.now, w.idx, q.step)
        for q in done.values():
            self.executor.finished(q.sid, w.idx, q.target, self.now)
            self.sample_left(q.step)
        self._report_progress()
        self.admission.preempt(w)
        for idx in sorted(dirty):
            self.refill(self.workers[idx])

    def _report_progress(self) -> None:
        """Tell the executor of the watched samples that reached their count, still where they were."""
        progress = self.progress
        while progress:
            sid, where, watched = progress.popleft()
            q = self.seqs[sid]
            if q.done or not q.running or q.where != where:
                continue
            self.decode.advance(self.workers[where], self.now)
            gen = self.decode.gen_at(q, self.workers[where].it, self.workers[where].alpha)
            if gen < watched:
                raise AssertionError(f"sample {sid}: progress reported at {gen} tokens, watched for {watched}")
            self.executor.progressed(sid, where, gen, self.now)

    def _on_gate(self, kind: int, arg: int) -> None:
        if kind == TRAINED:
            self.trained_through = max(self.trained_through, arg)
            if self.hooks is not None:
                self.hooks.between_steps(self, arg)
            if self.sched.pipeline == "shared" and self.sched.interrupt_on_update:
                for w in self.workers:
                    if w.running:
                        self.admission.reprefill(w, self.now)
                        self.events.schedule(w)
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

    def open_gates(self) -> None:
        """Plan what may start, deal the shared queue, let idle workers start or steal."""
        self._on_gate(GATE, 0)

    def _deal(self) -> None:
        """Shared pipeline, steps just released: the queue is dealt one sample at a time round-robin
        over the workers with a free slot (as the rollout fleet deals it), so a queue in the
        scheduler's order (the longest first) spreads over the workers instead of filling one."""
        cap = self.admission.cap
        room = [w for w in self.workers if len(w.running) < cap and w.idx not in self.gone]
        while room and self.shared:
            took = []
            for w in room:
                if not self.shared:
                    break
                before = len(w.running)
                self.idle.discard(w.idx)
                self.refill(w, 1)
                if len(w.running) > before and len(w.running) < cap and not w.waiting:
                    took.append(w)
            room = took

    def run(self, on_event: Callable[[Simulator], None] | None = None) -> SimResult:
        total = len(self.seqs)
        drafters = self.drafters
        if drafters is not None and self.hooks is not None:
            raise SimulationError("freed drafters: not priced on a fleet that changes while it runs")
        self.open_gates()
        if drafters is not None:
            drafters.place()
        while self.events:
            t, _, kind, arg = self.events.pop()
            if kind == WORKER:
                w = self.workers[arg >> 32]
                if (arg & 0xFFFFFFFF) != w.version:
                    continue
                self.now = max(self.now, t)
                self._on_worker(w)
            elif kind == TOOL:
                self.now = max(self.now, t)
                self.tools.answered(arg)
            elif kind == FLEET and self.hooks is not None:
                self.now = max(self.now, t)
                self.hooks.on_fleet_event(self, arg)
            else:
                self.now = max(self.now, t)
                self._on_gate(kind, arg)
            if drafters is not None:
                drafters.place()
            if on_event is not None:
                on_event(self)
        if len(self.finished) != total:
            raise SimulationError(
                f"{self.sched.label}: {total - len(self.finished)} of {total} samples never finished "
                f"(completed through step {self.completed_through}, trained through {self.trained_through})"
            )
        for w in self.workers:
            self.admission.close(w, w.clock)
        if drafters is not None:
            drafters.close()
        return collect_result(self, total)

    def drafting_report(self) -> list[StepDrafting]:
        """After `run`: per step, the workers that drafted for others and the step's tail (drafting.py)."""
        steps = range(self.first_step, self.last_step + 1)
        finishes: dict[int, list[float]] = {s: [] for s in steps}
        for t, _, st in self.finished.values():
            finishes[st].append(t)
        windows = {s: (self.step_start.get(s, 0.0), self.completed.get(s, 0.0)) for s in steps if finishes[s]}
        return step_drafting(self.draft_spans, windows, finishes)

    @property
    def draft_spans(self) -> list[DraftSpan]:
        """Every drafter's assignment as it ran: drafter, verifier, start, end (drafters.py)."""
        return [] if self.drafters is None else self.drafters.spans

    @property
    def consolidations(self) -> int:
        """Workers emptied onto another so that they draft (DraftCosts.consolidate)."""
        return 0 if self.drafters is None else self.drafters.consolidations

    @property
    def step_start(self) -> dict[int, float]:
        """Per step: the first admission of one of its samples."""
        return self.admission.step_start

    @property
    def shipped_bytes(self) -> float:
        """History index bytes shipped to the workers (shipping.py)."""
        return self.shipping.shipped_bytes

    @property
    def ship_wait(self) -> float:
        """Worker-seconds spent waiting for history indexes."""
        return self.shipping.ship_wait

    # ------------------------------------------------------------------ the fleet changing (elastic.py)
    def fleet_event(self, t: float, arg: int) -> None:
        """Have the fleet hooks called with `arg` at time `t`."""
        self.events.push(t, FLEET, arg)

    def live_slots(self) -> list[int]:
        """The indexes of the workers that have not left."""
        return self.membership.live_slots()

    def quiescent(self) -> bool:
        """No sample on a worker, at a tool call or in a plan not taken up: the fleet may be renumbered."""
        return self.membership.quiescent()

    def join(self) -> int:
        """A worker joins now (taking samples handed back, then what the gates allow); its index."""
        return self.membership.join()

    def leave(self, slot: int, keep_tokens: bool) -> int:
        """Worker `slot` leaves now, its samples handed to the live workers (with their tokens when
        `keep_tokens`); the generated tokens lost."""
        return self.membership.leave(slot, keep_tokens)

    def hand_back(self) -> None:
        """Spread the samples that workers who left still hold over the live workers."""
        self.membership.hand_back()

    def compact(self, keep: list[int]) -> None:
        """Between steps: the workers `keep` become 0..n-1, the others are gone."""
        self.membership.compact(keep)


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
