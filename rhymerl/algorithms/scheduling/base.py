"""The scheduler state machine shared by every policy.

A scheduler is driven by events from the one executor (executor.py) over a fleet of rollout
workers (the simulator's, in-process ones, Ray's): `plan_round` when a step's samples are known,
`on_sample_finished` when a response completes, `on_progress` when a sample reaches a token count
the scheduler asked to watch, `on_idle` when a worker has nothing left to do, `on_leave` when a
worker leaves the fleet with samples, and `on_moved` / `on_move_failed` when a move is confirmed or
refused. Each returns plain actions (`Watch`, `Move`, `Rebalance`) and never does I/O or reads a
clock, so the same object runs in the simulator and in production.

The fleet may grow while a step runs (`add_worker`: a joining worker takes work by stealing) and is
re-sized between plans (`set_workers`): a worker that leaves mid-step keeps its index, with nothing
outstanding, until the next plan.

The base class keeps the books every policy needs and checks them: each sample is planned,
moved and finished at most once per step, inter-step migrations keep their generated tokens
and reappear in exactly one later plan, and per-prompt lengths flow into `history` when a
prompt's whole group has finished.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from .costmodel import NO_SPECULATION, IterationProfile, RooflineProfile, SpeculationSpeedup
from .history import LengthHistory
from .types import Action, Move, MoveReason, Pipeline, RoundPlan, Sample, SampleId


class SchedulerOptions(TypedDict, total=False):
    """Keyword options every policy accepts (see `Scheduler.__init__`)."""

    profile: IterationProfile | None
    speculation: SpeculationSpeedup
    staleness: int
    seed: int
    final_round: int | None
    history: LengthHistory | None
    learns_lengths: bool


class SchedulingError(RuntimeError):
    """An executor reported an impossible event (a sample finished twice, an unknown sample, ...)."""


@dataclass(slots=True)
class SampleState:
    sample: Sample
    round_no: int | None
    worker: int | None
    visit: tuple[str, int]
    group: int = -1
    migrated: bool = False
    done: bool = False


@dataclass
class SchedulerStats:
    planned: int = 0
    finished: int = 0
    intra_step: int = 0
    inter_step: int = 0
    rebalanced: int = 0
    stolen: int = 0
    """Unfinished samples an idle worker of the same step took over, with their tokens (none for
    samples not started yet)."""
    evacuated: int = 0
    """Samples of a worker that left the fleet (or died), moved to the others with their tokens."""
    migrated_samples: set[SampleId] = field(default_factory=set)
    rankings: dict[int, str] = field(default_factory=dict)


class Scheduler:
    """Base policy: subclasses implement `_plan` and may react in `_after_finish` / `_progress`."""

    name: str = "base"
    pipeline: Pipeline = "barrier"
    needs_history: bool = False
    interrupt_on_update: bool = False
    """Shared pipeline only: running samples recompute their KV cache when new weights arrive."""
    fills_batch: bool = False
    """Shared pipeline only: a worker pulls up to its engine's batch limit (and KV cache), not just
    the even split of a step (AReaL's concurrency limit)."""

    def __init__(
        self,
        workers: int,
        *,
        profile: IterationProfile | None = None,
        speculation: SpeculationSpeedup = NO_SPECULATION,
        staleness: int = 1,
        seed: int = 0,
        final_round: int | None = None,
        history: LengthHistory | None = None,
        learns_lengths: bool = True,
    ) -> None:
        """history: the length history to rank by (shared with its owner; a fresh one if None);
        learns_lengths: observe each group's lengths as its last sample finishes (the simulator,
        standing in for a controller); False where the controller records history after each step."""
        if workers < 1:
            raise ValueError("workers: at least 1")
        if staleness < 0:
            raise ValueError("staleness: at least 0")
        self.workers = workers
        self.profile: IterationProfile = RooflineProfile() if profile is None else profile
        self.speculation = speculation
        self.staleness = staleness
        self.seed = seed
        self.final_round = final_round
        self.history = LengthHistory() if history is None else history
        self.learns_lengths = learns_lengths
        self.stats = SchedulerStats()
        self.last_planned = 0
        self._samples: dict[SampleId, SampleState] = {}
        self._deferred: list[SampleId] = []
        self._outstanding: dict[tuple[int, int], int] = defaultdict(int)
        self._round_left: dict[int, int] = defaultdict(int)
        self._visit_left: dict[tuple[str, int], int] = defaultdict(int)
        self._visit_lengths: dict[tuple[str, int], list[int]] = defaultdict(list)

    @property
    def label(self) -> str:
        return self.name

    # ------------------------------------------------------------------ events
    def prime(self, prompt_id: str, lengths: Sequence[int]) -> None:
        """Feed history from outside (e.g. last epoch's dumps when resuming a run)."""
        self.history.observe(prompt_id, lengths)

    def plan_round(self, round_no: int, samples: Sequence[Sample]) -> RoundPlan:
        """Plan a step: the new samples plus any deferred here by inter-step migration."""
        if round_no <= self.last_planned:
            raise SchedulingError(f"round {round_no}: already planned up to round {self.last_planned}")
        carried = [self._samples[sid].sample for sid in self._deferred]
        self._deferred = []
        for s in samples:
            if s.sid in self._samples:
                raise SchedulingError(f"sample {s.sid}: planned twice")
            visit = (s.prompt_id, round_no)
            self._samples[s.sid] = SampleState(sample=s, round_no=round_no, worker=None, visit=visit)
            self._visit_left[visit] += 1
        for s in carried:
            self._samples[s.sid].round_no = round_no
        plan = self._plan(round_no, list(samples), carried)
        plan.carried = [s.sid for s in carried]
        self._check_plan(plan, samples, carried)
        for w, queue in enumerate(plan.queues):
            for sid in queue:
                self._samples[sid].worker = w
                self._outstanding[(w, round_no)] += 1
        self._round_left[round_no] += len(samples) + len(carried)
        self.stats.planned += len(samples)
        self.stats.rankings[round_no] = plan.ranking
        self.last_planned = round_no
        self._forget_before(round_no - 2)
        return plan

    def on_sample_finished(self, sid: SampleId, worker: int, output_len: int, now: float) -> list[Action]:
        st = self._state(sid)
        if st.done:
            raise SchedulingError(f"sample {sid}: finished twice")
        if st.round_no is None:
            raise SchedulingError(f"sample {sid}: finished while deferred to a later step")
        if st.worker is not None and st.worker != worker:
            raise SchedulingError(f"sample {sid}: finished on worker {worker}, scheduled on {st.worker}")
        st.done = True
        st.worker = worker
        if self.pipeline != "shared":
            self._outstanding[(worker, st.round_no)] -= 1
        self._round_left[st.round_no] -= 1
        self.stats.finished += 1
        self._visit_left[st.visit] -= 1
        self._visit_lengths[st.visit].append(output_len)
        if self._visit_left[st.visit] == 0:
            lengths = self._visit_lengths.pop(st.visit)
            if self.learns_lengths:
                self.history.observe(st.visit[0], lengths)
            del self._visit_left[st.visit]
        return self._after_finish(st, now)

    def on_progress(self, sid: SampleId, worker: int, generated: int, now: float) -> list[Action]:
        st = self._state(sid)
        if st.done or st.round_no is None:
            return []
        st.sample.generated = generated
        return self._progress(st, worker, generated, now)

    def on_admitted(self, sid: SampleId, worker: int) -> None:
        """Shared pipeline: the executor tells which worker pulled a sample."""
        self._state(sid).worker = worker

    def on_idle(self, worker: int, round_no: int, unfinished: Mapping[int, Sequence[tuple[SampleId, int]]]) -> list[Move]:
        """Work stealing: `worker` has finished its own samples of `step` (or just joined the fleet)
        and cannot start the next step yet. `unfinished` lists, per other worker, its samples of
        `step` that have not finished, as (sample, tokens generated so far): waiting ones in queue
        order, then running ones. The returned moves hand some of them to `worker`, with their tokens
        (taking an unstarted sample is the trivial case: nothing to recompute). They are requests:
        the books change when the executor confirms them (`on_moved(..., "steal")`). Default: no
        stealing."""
        if not unfinished:
            return []
        moves = self._steal(worker, round_no, unfinished)
        offers: dict[int, dict[SampleId, int]] = {}  # per source, built once: a steal may take thousands
        for m in moves:
            st = self._state(m.sid)
            if m.src not in offers:
                offers[m.src] = dict(unfinished.get(m.src, ()))
            offered = offers[m.src]
            if st.done or st.round_no != round_no or st.worker != m.src or m.dst != worker or m.sid not in offered:
                raise SchedulingError(f"sample {m.sid}: cannot be stolen by worker {worker} for round {round_no}")
        return moves

    def on_leave(self, worker: int, round_no: int, samples: Sequence[tuple[SampleId, int]],
                 live: Sequence[int]) -> list[Move]:
        """`worker` left the fleet (asked to, sent SIGTERM, or died) holding these unfinished samples of
        `step` (with the tokens they keep); `live` are the workers that can take them. Each goes,
        the longest first, to the live worker with the least outstanding work of the step (counting
        what this decision already gave it). Requests, booked on confirmation (`on_moved(..., "leave")`);
        none when no worker is live (the fleet holds them until one joins)."""
        if not live:
            return []
        load = {w: self.outstanding(w, round_no) for w in live}
        moves = []
        for sid, generated in sorted(samples, key=lambda s: (-s[1], s[0])):
            dst = min(live, key=lambda w: (load[w], w))
            load[dst] += 1
            moves.append(Move(sid=sid, src=worker, dst=dst, generated=generated, recompute=True))
        return moves

    def on_moved(self, moves: Sequence[Move], reason: MoveReason = "rebalance") -> None:
        """The executor carried out these moves it chose or was asked for (a `Rebalance`, a steal, a
        worker leaving): the books follow them."""
        for m in moves:
            self._book_move(m, migrated=reason == "rebalance")
            if reason == "steal":
                self.stats.stolen += 1
            elif reason == "leave":
                self.stats.evacuated += 1
            else:
                self.stats.rebalanced += 1

    def add_worker(self) -> int:
        """A worker joined the fleet while a step runs: its index (it has nothing outstanding)."""
        self.workers += 1
        return self.workers - 1

    def set_workers(self, workers: int) -> None:
        """The fleet's size for the next plan; a worker index dropped must hold nothing unfinished."""
        if workers < 1:
            raise ValueError("workers: at least 1")
        busy = sorted({w for (w, _), n in self._outstanding.items() if n > 0 and w >= workers})
        if busy:
            raise SchedulingError(f"workers {busy} still hold unfinished samples: cannot shrink the fleet to {workers}")
        self.workers = workers

    def on_move_failed(self, m: Move) -> None:
        """The executor could not carry out move `m` this scheduler decided: the sample finished where
        it was before it could be handed over (an executor that reaches a worker over the network
        learns of moves after the fact). The books return to before the move; the sample stays
        marked migrated, so it is not chosen again."""
        st = self._state(m.sid)
        if st.done or st.worker != m.dst:
            raise SchedulingError(f"sample {m.sid}: move {m.src} -> {m.dst} cannot be undone")
        if m.dst is None:
            if m.sid not in self._deferred:
                raise SchedulingError(f"sample {m.sid}: undoing a deferral it does not have")
            self._deferred.remove(m.sid)
            st.round_no = st.visit[1]
            self._round_left[st.round_no] += 1
            self.stats.inter_step -= 1
        else:
            assert st.round_no is not None
            if self.pipeline != "shared":
                self._outstanding[(m.dst, st.round_no)] -= 1
            self.stats.intra_step -= 1
        st.worker = m.src
        if self.pipeline != "shared":
            self._outstanding[(m.src, st.round_no)] += 1
        self.stats.migrated_samples.discard(m.sid)
        self._move_failed(st, m)

    # ------------------------------------------------------------------ queries
    def outstanding(self, worker: int, round_no: int) -> int:
        """This step's samples on a worker that have not finished (waiting or running)."""
        return self._outstanding.get((worker, round_no), 0)

    def round_left(self, round_no: int) -> int:
        return self._round_left.get(round_no, 0)

    def deferred(self) -> list[SampleId]:
        return list(self._deferred)

    def may_start(self, step: int, trained_through: int, completed_through: int) -> bool:
        """Whether rollout of training step `step` may begin on a worker whose own previous sub-batch
        is done (the simulator's gate, where each step is one round; the fleet's step loop bounds the
        lag itself: workers/controller/batches.py).

        trained_through: the last step whose training finished (its weights are loadable);
        completed_through: the last step all of whose samples finished (earlier ones too). Every
        pipeline keeps off-policyness within `staleness` (step s uses weights no older than
        s - 1 - staleness); the barrier pipeline also waits for the previous step's rollout.
        Shared pipelines apply this per sample: a step's samples are released when it holds.
        """
        if trained_through < step - 1 - self.staleness:
            return False
        return not (self.pipeline == "barrier" and completed_through < step - 1)

    def later_round_possible(self) -> bool:
        return self.final_round is None or self.last_planned < self.final_round

    # ------------------------------------------------------------------ policy hooks
    def _plan(self, round_no: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        raise NotImplementedError

    def _after_finish(self, st: SampleState, now: float) -> list[Action]:
        return []

    def _progress(self, st: SampleState, worker: int, generated: int, now: float) -> list[Action]:
        return []

    def _steal(self, worker: int, round_no: int, unfinished: Mapping[int, Sequence[tuple[SampleId, int]]]) -> list[Move]:
        return []

    def _move_failed(self, st: SampleState, m: Move) -> None:
        """A policy's own books for a move it decided that did not happen."""

    # ------------------------------------------------------------------ helpers
    def _forget_before(self, round_no: int) -> None:
        """Drop finished samples of old steps so a long run's books stay small (a late event for one
        of them is then reported as never planned, still an error)."""
        old = [sid for sid, st in self._samples.items() if st.done and st.round_no is not None and st.round_no < round_no]
        for sid in old:
            del self._samples[sid]

    def _state(self, sid: SampleId) -> SampleState:
        try:
            return self._samples[sid]
        except KeyError:
            raise SchedulingError(f"sample {sid}: never planned") from None

    def _book_move(self, m: Move, migrated: bool = True) -> None:
        """Update the books for a move the executor performs; `migrated`: it counts as a migration
        (an outlier's or a rebalance, not a steal or a leaving worker's samples) and the sample is not
        chosen for one again."""
        st = self._state(m.sid)
        if st.done or st.round_no is None:
            raise SchedulingError(f"sample {m.sid}: cannot move a finished or deferred sample")
        if st.worker is not None and st.worker != m.src:
            raise SchedulingError(f"sample {m.sid}: moved from worker {m.src}, scheduled on {st.worker}")
        st.sample.generated = m.generated
        if migrated:
            st.migrated = True
            self.stats.migrated_samples.add(m.sid)
        if self.pipeline != "shared":
            self._outstanding[(m.src, st.round_no)] -= 1
        if m.dst is None:
            self._round_left[st.round_no] -= 1
            st.round_no = None
            st.worker = None
            self._deferred.append(m.sid)
        else:
            st.worker = m.dst
            if self.pipeline != "shared":
                self._outstanding[(m.dst, st.round_no)] += 1

    def _emit(self, m: Move) -> Move:
        """Book a move this scheduler decided; the executor must carry it out (no `on_moved`)."""
        self._book_move(m)
        if m.dst is None:
            self.stats.inter_step += 1
        else:
            self.stats.intra_step += 1
        return m

    def _check_plan(self, plan: RoundPlan, samples: Sequence[Sample], carried: Sequence[Sample]) -> None:
        if len(plan.queues) != self.workers and not (self.pipeline == "shared" and not plan.queues):
            raise SchedulingError(f"{self.name}: plan has {len(plan.queues)} queues for {self.workers} workers")
        planned = plan.all_samples()
        expected = {s.sid for s in samples} | {s.sid for s in carried}
        if len(planned) != len(expected) or set(planned) != expected:
            raise SchedulingError(f"{self.name}: round {plan.round_no} plan does not place every sample exactly once")
