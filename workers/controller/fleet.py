"""The rollout fleet: the job's rollout workers as the step loop drives them, one implementation
for every backend (workers in this process, Ray workers on pods), reached through a Transport.

A scheduling round places samples on the workers (the job's scheduling policy plans it: one
scheduler object for the run, hearing every event), starts one rollout call per worker and follows
the calls' reports: finishes and token counts go to the scheduler, and what it decides is carried
out by the one executor (rhymerl.algorithms.scheduling.executor), the fleet being its `Fleet`. A
move is a request: the source call hands the sample back with its tokens at its next pass
(`RolloutWorker.release`), and it joins the destination's running call (`admit`) or starts one
there; inter-step moves wait for the next round. Each call's output goes to a reward worker.

Membership is elastic. The fleet follows how many workers are wanted (`wanted()`: the spec in a
cluster, `rhymerl scale` on one machine) within the capacity there is (rollout pods that joined,
one worker each): a joining
worker takes work at once (it steals started samples with their tokens, or gets the next
placement); a worker asked to leave, or sent SIGTERM, hands its unfinished samples back with their
tokens and is stopped (in a cluster those on the highest pod ordinals leave first: they are the pods a
StatefulSet removes, and the fleet reports how many leading ordinals hold its workers, `in_use`, so the
operator lowers the count only once they are drained: operator/reconcile/drain.py); a worker that dies without notice has its samples resumed elsewhere from
their last snapshot (tokens identical: sampling is keyed by position). Nothing caps how often a
worker may come and go; a sample whose workers died RERUNS + 1 times stops the run (it is killing
them). With no worker left the fleet waits, and says why.

Every sample's state (its scheduler id, the call holding it with its tokens, a move asked, parked,
watched, finished, how often it lost its worker) is in one round book
(rhymerl.algorithms.scheduling.round_book). The class here composes the parts, each one job over
that book and the records (fleet_records.py): membership (fleet_members.py), weights
(fleet_weights.py), starting calls (fleet_calls.py), following reports (fleet_reports.py), parking
and placing samples (fleet_places.py), freed drafters (fleet_drafters.py), scoring
(fleet_scoring.py); it keeps the rounds and the executor's port.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.costmodel import SpeculationSpeedup
from rhymerl.algorithms.scheduling.executor import Executor
from rhymerl.algorithms.scheduling.factory import make_scheduler
from rhymerl.algorithms.scheduling.fleet_size import FleetAdvice, calibration, predicted_lengths, recommend
from rhymerl.algorithms.scheduling.history import LengthHistory
from rhymerl.algorithms.scheduling.round_book import RoundBook
from rhymerl.algorithms.scheduling.types import Move, Sample, SampleId
from rhymerl.api import RLJob
from rhymerl.workers.controller.fleet_calls import CallStarter
from rhymerl.workers.controller.fleet_drafters import FreedDrafters
from rhymerl.workers.controller.fleet_members import Membership
from rhymerl.workers.controller.fleet_places import Placement
from rhymerl.workers.controller.fleet_records import (
    Book,
    Call,
    Calls,
    Member,
    Parked,
    Round,
    WorkerLost,
    by,
    pod_ordinal,
    table_profile,
)
from rhymerl.workers.controller.fleet_reports import Reports
from rhymerl.workers.controller.fleet_scoring import Scoring
from rhymerl.workers.controller.fleet_weights import FleetWeights
from rhymerl.workers.controller.history_client import HistoryClient
from rhymerl.workers.controller.role_apis import RewardAPI, RolloutAPI, Weights
from rhymerl.workers.controller.transport import (
    Handle,
    Indexes,
    Result,
    ResultLost,
    Transport,
    WorkerGone,
    pipelined,
)
from rhymerl.workers.controller.weight_broadcast import WeightBroadcast
from rhymerl.workers.roles.samples import CallSummary, SampleRef, ScoredSample

__all__ = ["RolloutFleet", "Round", "WorkerLost", "pod_ordinal", "table_profile"]


class RolloutFleet:
    """The job's rollout workers as the step loop drives them, and the executor's `Fleet`."""

    def __init__(self, job: RLJob, transport: Transport, lengths: LengthHistory, encoded: dict[str, list[int]],
                 reward: Sequence[Handle[RewardAPI]], start_worker: Callable[[], Handle[RolloutAPI]],
                 wanted: Callable[[], int],
                 note: Callable[[str], None], say: Callable[[str], None],
                 in_use: Callable[[int | None], None] = lambda pods: None, scheduler: Scheduler | None = None) -> None:
        """start_worker: a new rollout worker's handle; wanted: how many workers the job wants now;
        note: an event for the run's log; say: what the fleet is doing, for a status line; in_use:
        told `pods_in_use()` whenever it changes; scheduler: the job's policy's (tests pass their
        own). `reconcile` starts workers from here on; they join, and rounds run, once `start` gave
        the fleet its weights and history."""
        self.job, self.transport, self.encoded, self.note = job, transport, encoded, note
        self.history: HistoryClient
        spec = job.spec
        self.sched: Scheduler = scheduler or make_scheduler(
            spec.scheduling, 1, seed=spec.rollout.seed, max_off_policy=spec.algorithm.max_off_policy_steps,
            history=lengths, learns_lengths=False)
        self.executor = Executor(self.sched, self)
        self.book: Book = RoundBook()
        self.calls = Calls()
        self.versions = FleetWeights(transport, note)
        self.membership = Membership(job, transport, self.book, self.calls, self.versions, start_worker, wanted,
                                     note, say, in_use)
        self.membership.on_join = self._on_join
        self.starter = CallStarter(job, transport, self.book, self.calls, self.versions, encoded,
                                   lambda: len(self.membership.members))
        self.placement = Placement(transport, self.book, self.calls, self.membership, self.starter, self.executor,
                                   lambda: self.live_round, note)
        self.scoring = Scoring(transport, reward, self.calls, self.placement.restart, note)
        self.reports = Reports(transport, self.book, self.executor, self.placement, self.scoring.score,
                               self.starter.relays_groups)
        self.drafters = FreedDrafters(job, transport, self.book, self.calls, self.membership, self.sched,
                                      self.executor, note,
                                      self.starter.drafts_remotely, self.starter.releasable)
        self.rounds = 0
        self.live_round: Round | None = None

    # ------------------------------------------------------------------ what the step loop reads
    @property
    def members(self) -> list[Member]:
        return self.membership.members

    @property
    def version(self) -> int:
        return self.versions.version

    @property
    def weights(self) -> dict[int, Weights | Result[Weights]]:
        """Policy version -> its weights (those in use)."""
        return self.versions.weights

    @property
    def reruns(self) -> int:
        """Calls run again after their worker died (since the step loop last set it to 0)."""
        return self.calls.reruns

    @reruns.setter
    def reruns(self, value: int) -> None:
        self.calls.reruns = value

    def wanted(self) -> int:
        return self.membership.wanted()

    def live_count(self) -> int:
        """Workers in the fleet that take work (not leaving)."""
        return self.membership.live_count()

    def pods_in_use(self) -> int | None:
        return self.membership.pods_in_use()

    # ------------------------------------------------------------------ membership and weights
    def start(self, version: int, weights: Weights | Result[Weights], history: HistoryClient,
              older: Mapping[int, Weights | Result[Weights]] | None = None,
              rounds_before: int = 0, broadcast: WeightBroadcast | None = None) -> None:
        """Bring the fleet up to the wanted size with the run's current weights (workers `reconcile`
        started before have been starting meanwhile); the scheduler's cost model from the first
        worker's measured pass times. history: where rounds get their drafting indexes; older: the
        weights of earlier versions a resumed run had in flight; rounds_before: rounds planned
        before (a resumed run numbers its rounds on); broadcast: how published versions travel
        besides the object store (None: through it alone)."""
        self.history, self.rounds = history, rounds_before
        self.versions.start(version, {**(older or {}), version: weights}, broadcast)
        self.reconcile(wait=True)
        self.membership.started = True
        self.membership.last_count = (self.live_count(), max(1, self.wanted()))
        first = self.membership.live()[0]
        cost = self.transport.get(self.transport.call(first.handle, RolloutAPI.cost_profile))
        if cost is not None:
            self.sched.profile = table_profile(cost, self.job.spec.rollout.max_batch_size)

    def reconcile(self, wait: bool = False) -> None:
        """Workers join and leave to match `wanted()` within the room there is; `wait`: until at least
        one worker is live."""
        self.membership.reconcile(wait)

    def _on_join(self, m: Member) -> None:
        """A worker joined: while a round runs, it takes parked samples or steals started ones."""
        if self.live_round is not None:
            m.slot = self.sched.add_worker()
            self.live_round.workers.add(m.id)
            self.placement.unpark(self.live_round)
            self.executor.steal(m.slot, self.live_round.no)

    def publish(self, version: int, weights: Weights | Result[Weights]) -> None:
        """A new policy version: every worker loads it before its next call."""
        in_use = {p.version for _, p in self.book.parked_items()} | {c.version for c in self.calls.all()}
        live = self.membership.live()  # a call not collected may run again: its version is kept
        self.versions.publish(version, weights, in_use, live, [m for m in live if not self.calls.active(m)])

    def weight_sync(self) -> tuple[float, int]:
        """The longest weight load of any worker since the last call (they load in parallel), and
        how many loads found no broadcast copy and took the object store's (said in the run's log)."""
        return self.versions.sync(self.membership.live())

    def recommend(self, prompts: Sequence[str], rounds: Sequence[Round], train_s: float,
                  tokens_per_pass: float) -> FleetAdvice:
        """The fleet size for a step of these prompts (scheduling/fleet_size.py): its work predicted from
        the length history, priced by the scheduler's cost model calibrated on what `rounds` (the
        step just done) measured; with rollout overlapping training, no more workers than it takes
        to keep up with `train_s`."""
        spec = self.job.spec
        g = spec.algorithm.group_size
        lengths = predicted_lengths(self.sched.history, prompts, g)
        input_len = sum(len(self.encoded[p]) for p in prompts) / max(len(prompts), 1)
        speed = SpeculationSpeedup(tokens_per_pass=max(1.0, tokens_per_pass))
        ran = [(max(r.ends.values(), default=r.clock0) - r.clock0,
                np.array([s.length for _, summary in r.summaries for s in summary.samples], dtype=np.float64),
                len(r.workers)) for r in rounds]
        k = calibration(ran, input_len, self.sched.profile, speed)
        return recommend(lengths, input_len, self.sched.profile, (spec.rollout.min_replicas, spec.rollout.max_replicas),
                         speculation=speed, calibration=k, train_s=train_s if pipelined(self.job, self.transport) else None,
                         current=len(self.members))

    def end_step(self) -> None:
        for m in self.membership.live():
            self.transport.tell(m.handle, RolloutAPI.end_step)

    def close(self) -> None:
        for m in list(self.members):
            self.membership.stop(m)

    # ------------------------------------------------------------------ rounds
    def launch(self, groups: Sequence[tuple[int, str]], step: int, inter_step: bool,
               oracle: Mapping[SampleRef, int] | None = None,
               versions: Mapping[tuple[int, str], int] | None = None) -> Round:
        """Start a round: the groups (epoch, prompt) named, whole, and the samples deferred to it.
        inter_step: whether outliers of this round may be deferred to a later one; oracle: each
        sample's true length, for a policy that plans with perfect knowledge (lpt: benchmarks only);
        versions: the policy version of each group (default: the current one; a resumed run starts
        what was in flight with the versions it had, whose weights `start` was given)."""
        self.reconcile(wait=True)
        g = self.job.spec.algorithm.group_size
        epoch = groups[-1][0] if groups else 0
        rnd = Round(self.rounds + 1, step, epoch, [pid for _, pid in groups], inter_step)
        self.rounds += 1
        live = self._slots()
        self.sched.final_round = None if inter_step else rnd.no
        rnd.started = time.perf_counter()
        rnd.clock0 = self.transport.sync([m.handle for m in live])
        rnd.workers = {m.id for m in live}
        fresh = [SampleRef(pid, k, e) for e, pid in groups for k in range(g)]
        sids = {s: self.book.open(s) for s in fresh}
        carried = {s: p for s, p in self.book.parked_items() if p.round is None}
        plan = self.sched.plan_round(rnd.no, [Sample(sids[s], s.prompt_id, len(self.encoded[s.prompt_id]),
                                                    oracle_len=oracle.get(s) if oracle else None) for s in fresh])
        rnd.ranking = plan.ranking
        queues = [list(q) for q in plan.queues] or [[] for _ in live]
        for j, sid in enumerate(plan.shared):  # a shared queue is dealt round-robin
            self.sched.on_admitted(sid, j % len(live))
            queues[j % len(live)].append(sid)
        self.live_round = rnd
        for slot, queue in enumerate(queues):
            self._start_queue(live[slot], rnd, [self.book.key(sid) for sid in queue], carried, versions or {})
        for s in carried:
            self.book.unpark(s)
        return rnd

    def _slots(self) -> list[Member]:
        """The workers a new round plans for (the scheduler's indexes in id order)."""
        live = sorted(self.membership.staying(), key=lambda m: m.id) or self.membership.live()
        for slot, m in enumerate(live):
            m.slot = slot
        for m in self.members:
            if m not in live:
                m.slot = -1
        self.sched.set_workers(len(live))
        return live

    def _start_queue(self, m: Member, rnd: Round, mine: list[SampleRef], carried: Mapping[SampleRef, Parked],
                     versions: Mapping[tuple[int, str], int]) -> None:
        """One worker's queue of a new round: fresh samples by policy version, carried ones by the
        version and indexes they began with."""
        def version_of(s: SampleRef) -> int:
            return versions.get((s.epoch, s.prompt_id), self.version)

        new = [s for s in mine if s not in carried]
        if new:
            indexes = self._indexes(rnd, sorted({s.prompt_id for s in new}))
            for part in by(new, version_of):
                self.starter.open(m, rnd, part, indexes, version_of(part[0]), {}, {})
        moved = [s for s in mine if s in carried]
        for part in by(moved, lambda s: (carried[s].version, id(carried[s].indexes))):
            first = carried[part[0]]
            self.starter.open(m, rnd, part, first.indexes, first.version,
                              {s: carried[s].resume for s in part}, {s: carried[s].tokens for s in part})

    def _indexes(self, rnd: Round, prompt_ids: list[str]) -> Result[Indexes] | None:
        if not self.job.spec.rollout.speculation.reads_history:
            return None
        indexes = self.history.indexes(rnd.epoch, prompt_ids, rnd.step)
        rnd.history_ok = (rnd.history_ok is not False) and indexes is not None
        return indexes

    # ------------------------------------------------------------------ following a round
    def collect(self, rnd: Round) -> list[tuple[CallSummary, Result[list[ScoredSample]]]]:
        """Follow the round until every sample of it is generated and scored (or deferred to a later
        round); each call's summary and its scored samples."""
        self.live_round = rnd
        while True:
            self._follow(rnd)
            rnd.generated = time.perf_counter()
            if not self.transport.concurrent:
                for c in rnd.calls:
                    if c.output is not None and c.summary is None:
                        self.scoring.score(c)
            if self.scoring.summaries(rnd):
                break
        rnd.scored = time.perf_counter()
        self.live_round = None
        for c in rnd.calls:
            self.calls.drop(c)
            self.book.close(c.id)
        self.reports.end_round(rnd)
        for m in [m for m in self.members if m.leaving and not self.calls.active(m)]:
            self.membership.stop(m)
        return [(summary, _scored(c)) for c, summary in rnd.summaries]

    def _follow(self, rnd: Round) -> None:
        """Until every call of the round has its output and no sample of it waits for a place."""
        while True:
            self.reconcile()
            live = [c for c in rnd.calls if not c.ended]
            if not live and not any(p.round is rnd for _, p in self.book.parked_items()):
                return
            if not self.membership.staying():
                self.membership.wait_for_worker()
                continue
            self.membership.waiting_since = None
            self.placement.unpark(rnd)
            streams = [c.stream for c in live if c.stream is not None]
            try:
                report = self.transport.next_report(streams, timeout=1.0)
            except WorkerGone as gone:
                self.placement.lost(self.calls.of_stream(gone.args[0]),
                                    str(gone.args[1]) if len(gone.args) > 1 else "")
                continue
            except ResultLost as lost:
                self.placement.restart(self.calls.of_stream(lost.args[0]))
                continue
            if report is not None:
                self.reports.on_report(self.calls.of_stream(report.stream), report)
            self._steal_for_idle(rnd)
            self.drafters.after_event(rnd)

    def _steal_for_idle(self, rnd: Round) -> None:
        for m in self.membership.staying():
            if m.slot >= 0 and not self.calls.active(m) and m.id in rnd.workers:
                self.executor.steal(m.slot, rnd.no)

    def forget(self, samples: Sequence[SampleRef]) -> None:
        """Samples whose groups trained: their books close."""
        for s in samples:
            self.book.forget(s)

    # ------------------------------------------------------------------ the executor's fleet
    def watch(self, sid: SampleId, tokens: int) -> None:
        s = self.book.key(sid)
        self.book.watch(s, tokens)
        for c in self.calls.running():
            if self.book.reached(s, self.book.tokens(c.id).get(s, -1)):
                self.executor.progressed(sid, c.member.slot, self.book.tokens(c.id)[s],
                                         self.transport.clock(c.member.handle))
                return

    def request(self, move: Move) -> None:
        s = self.book.key(move.sid)
        if (p := self.book.parked(s)) is not None:  # in the fleet's hands already: placed now
            if move.dst is None:
                p.round = None
                self.book.defer(s)
            else:
                self.placement.place([s], self.membership.at(move.dst), src=None)
            self.executor.confirmed(Move(sid=move.sid, src=move.src, dst=move.dst, generated=p.tokens))
            return
        holder = [c for c in self.calls.running() if s in self.book.tokens(c.id)]
        if not holder or not self.starter.releasable or holder[0].member.leaving:
            self.executor.refused(move.sid)
            return
        self.book.ask(s, move)
        self.transport.tell(holder[0].member.handle, RolloutAPI.release, holder[0].id, [s])

    def unfinished(self, worker: int, round_no: int) -> Sequence[tuple[SampleId, int]]:
        return self.book.unfinished(self.calls.holding(worker, round_no))


def _scored(call: Call) -> Result[list[ScoredSample]]:
    assert call.scored is not None, "a summarised call was scored"
    return call.scored
