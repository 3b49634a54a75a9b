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
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.costmodel import IterationProfile, SpeculationSpeedup, TableProfile
from rhymerl.algorithms.scheduling.executor import Executor
from rhymerl.algorithms.scheduling.factory import make_scheduler
from rhymerl.algorithms.scheduling.fleet_size import FleetAdvice, calibration, predicted_lengths, recommend
from rhymerl.algorithms.scheduling.freed_drafters import (
    DraftCosts,
    ScaledProfile,
    WorkerView,
    assign,
    consolidation,
)
from rhymerl.algorithms.scheduling.history import LengthHistory
from rhymerl.algorithms.scheduling.types import Move, Sample, SampleId
from rhymerl.api import RLJob
from rhymerl.workers import faults
from rhymerl.workers.controller.history_client import HistoryClient
from rhymerl.workers.controller.role_apis import RewardAPI, RolloutAPI, Weights, WeightsRef
from rhymerl.workers.controller.transport import (
    Handle,
    Indexes,
    Report,
    Result,
    ResultLost,
    Stream,
    Transport,
    WorkerGone,
    pipelined,
)
from rhymerl.workers.controller.weight_broadcast import WeightBroadcast
from rhymerl.workers.roles.samples import (
    CallState,
    CallSummary,
    Handback,
    RolloutCall,
    RolloutOutput,
    RolloutProgress,
    SampleRef,
    ScoredSample,
)
from rhymerl.workers.roles.weight_sync import STAGED_WAIT_S
from rhymerl.workers.rollout.engine import GenRequest
from rhymerl.workers.rollout.group_drafts import GrownTokens
from rhymerl.workers.rollout.sampling import sample_key

RERUNS = 3  # a sample may lose its worker this often; once more stops the run
STATE_PASSES = 4  # a Ray call's token-count reports (a scheduler acts on them), any call's shares of its tokens (passes)
SNAPSHOT_PASSES = 16  # a Ray call's snapshots of its samples' tokens (what a re-run resumes from)
ADMIT_WAIT_S = 10.0
DRAFT_STEP_COST = 0.5
"""A draft-model step over a policy pass at the same batch, as the freed-drafter decision prices it: the
shipped tiny-arith-draft measured 0.51-0.54 on the 2-core CPU (benchmarks/draft-model); on a GPU a
model 10x smaller costs less, so this errs toward not drafting."""
WAIT_NOTE_S = 60.0  # how often the fleet says again that it waits for a rollout worker
Progress = RolloutProgress | Result[RolloutProgress]
"""Samples' tokens so far: a report's item (where a worker left them), or gathered here from several."""
CAPACITY_EVERY_S = 1.0  # how often a Ray fleet asks the cluster how many rollout pods joined


def pod_ordinal(host: str, job_name: str) -> int | None:
    """The ordinal of rollout pod `host` of job `job_name` (a StatefulSet pod's host name is its pod
    name, `<job>-rollout-<ordinal>`); None for any other host (a worker on this machine)."""
    found = re.fullmatch(re.escape(job_name) + r"-rollout-(\d+)", host)
    return int(found.group(1)) if found else None


class WorkerLost(RuntimeError):
    """A sample lost its worker more often than RERUNS, or a reward call failed that often."""


def table_profile(cost: CostProfile, max_batch: int) -> TableProfile:
    """The scheduler's cost model from an engine's measured pass times (rollout/verify_cost.py): the
    one-token column is a decode iteration per batch size; it was measured at one context length,
    so it is taken as constant in context; prefill is priced per token from the longest pass."""
    per_token = cost.seconds[0][-1] / cost.tokens[-1]
    decode = [row[0] for row in cost.seconds]
    if len(cost.batch_sizes) < 2:
        return TableProfile.constant(decode[0], max_batch, per_token)
    return TableProfile(batch_sizes=tuple(cost.batch_sizes), context_lens=(0, 1_000_000),
                        seconds=tuple((t, t) for t in decode), prefill_seconds_per_token=per_token,
                        max_batch=max_batch)


@dataclass(eq=False)
class Member:
    """One rollout worker of the fleet."""

    id: int
    handle: Handle[RolloutAPI]
    joined: bool = False  # answered: it takes work
    slot: int = -1  # its index in the scheduler's books for the current round
    leaving: bool = False
    pod: int | None = None  # the ordinal of the rollout pod it runs on (None: not known, or not in a cluster)
    version: int | None = None  # the policy version it was last told to load
    loads: list[Result[tuple[float, bool]]] = field(default_factory=list)  # its weight loads' (seconds, fell back)


@dataclass(eq=False)
class Call:
    """One rollout call: samples on one worker."""

    id: int
    member: Member
    round: Round
    samples: list[SampleRef]
    requests: list[GenRequest]
    indexes: Result[Indexes] | None
    version: int
    resume_of: dict[SampleRef, Progress | None]  # where each sample's tokens so far are (None: it starts afresh)
    resumed: dict[SampleRef, int]  # how many tokens that is
    stream: Stream | None = None
    tokens: dict[SampleRef, int] = field(default_factory=dict)  # unfinished samples, as last reported
    finished: dict[SampleRef, int] = field(default_factory=dict)  # lengths reported
    reported: bool = False  # its worker reported on it: it runs there, and hears a release
    output: Result[RolloutOutput] | None = None
    ended: bool = False  # its stream ended: with its output, or broken off
    scored: Result[list[ScoredSample]] | None = None
    summary: Result[CallSummary] | None = None


@dataclass(eq=False)
class Round:
    """One scheduling round: a plan's samples on the workers, until each is generated and scored."""

    no: int
    step: int
    epoch: int
    prompts: list[str]
    inter_step: bool
    ranking: str = "none"
    calls: list[Call] = field(default_factory=list)
    history_ok: bool | None = None
    started: float = 0.0  # wall clock
    clock0: float = 0.0  # the workers' clock at its start
    generated: float = 0.0  # wall clock when its last response was generated
    scored: float = 0.0  # ... and scored
    ends: dict[int, float] = field(default_factory=dict)  # worker id -> its clock at its last output
    workers: set[int] = field(default_factory=set)  # ids of the workers that ran calls of it
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    drafting: int = 0  # the most workers drafting for others at once (freed drafters)
    consolidations: int = 0  # workers emptied onto another so that they draft for it (freed drafters)
    summaries: list[tuple[Call, CallSummary]] = field(default_factory=list)


@dataclass
class Parked:
    """A sample in the fleet's hands: deferred to the next round, or its worker left (or died) and
    it waits for a place."""

    request: GenRequest
    resume: Progress | None
    tokens: int
    version: int
    indexes: Result[Indexes] | None
    round: Round | None = None  # the round it belongs to (None: deferred to the next)
    slot: int = -1  # the scheduler's index of the worker it left


class RolloutFleet:
    def __init__(self, job: RLJob, transport: Transport, lengths: LengthHistory, encoded: dict[str, list[int]],
                 reward: Sequence[Handle[RewardAPI]], start_worker: Callable[[], Handle[RolloutAPI]],
                 wanted: Callable[[], int],
                 note: Callable[[str], None], say: Callable[[str], None],
                 in_use: Callable[[int | None], None] = lambda pods: None) -> None:
        """start_worker: a new rollout worker's handle; wanted: how many workers the job wants now;
        note: an event for the run's log; say: what the fleet is doing, for a status line; in_use:
        told `pods_in_use()` whenever it changes. `reconcile` starts workers from here on; they
        join, and rounds run, once `start` gave the fleet its weights and history."""
        self.job, self.transport = job, transport
        self.history: HistoryClient
        self.encoded, self.reward, self.start_worker = encoded, reward, start_worker
        self.wanted, self.note, self.say, self.in_use = wanted, note, say, in_use
        self._in_use_said: int | None = None
        spec = job.spec
        self.releasable = spec.rollout.engine == "torch"  # a vLLM call is one generate: nothing comes back mid-call
        self.members: list[Member] = []
        self.ids = itertools.count()
        self.calls = itertools.count()
        self.rounds = 0
        self.version = 0
        self.weights: dict[int, Weights | Result[Weights]] = {}  # policy version -> its weights (those in use)
        self.broadcast: WeightBroadcast | None = None
        self.sched: Scheduler = make_scheduler(spec.scheduling, 1, seed=spec.rollout.seed,
                                               max_off_policy=spec.algorithm.max_off_policy_steps,
                                               history=lengths, learns_lengths=False)
        self.executor = Executor(self.sched, self)
        self.sids = itertools.count()
        self.sid: dict[SampleRef, int] = {}
        self.ref: dict[int, SampleRef] = {}
        self.watches: dict[SampleRef, int] = {}
        self.moving: dict[SampleRef, Move] = {}  # moves asked of a running call, not yet answered
        self.parked: dict[SampleRef, Parked] = {}
        self.told: set[SampleRef] = set()  # samples whose finish the scheduler has heard of
        self.losses: dict[SampleRef, int] = defaultdict(int)
        self.by_stream: dict[int, Call] = {}
        self.reruns = 0  # calls run again after their worker died (this step)
        self.live_round: Round | None = None
        self._capacity_at = -math.inf
        self._capacity: int | None = None
        self._waiting_since: float | None = None
        self._waiting_said = -math.inf
        self._last_count: tuple[int, int] | None = None
        self._started = False  # the fleet was up once: changes of its size are news from then on
        self.freed_drafters = spec.rollout.speculation.freed_drafters and self.releasable
        speculation = spec.rollout.speculation
        self.relays_groups = speculation.group_drafts and speculation.group_relay and speculation.reads_history \
            and self.releasable
        """Calls report their samples' new tokens, relayed to the calls running their siblings
        elsewhere (group drafts across workers; a vLLM call is one generate, its groups its own)."""
        self.heard_for: defaultdict[int, list[GrownTokens]] = defaultdict(list)
        """Per running call: its samples' siblings' tokens from other workers, not sent yet (`_relay`)."""
        self.reports_kept = 0  # reports whose tokens `heard_for` keeps
        self.drafting: dict[int, tuple[int, int]] = {}  # drafter's member id -> (verifier's member id, its call id)
        self.pair_drafters: Callable[[Sequence[WorkerView], Sequence[int], Mapping[int, int]], dict[int, int]] = \
            self._priced_pairs
        """Drafter -> verifier from the workers' state, the freed ones and the pairs in force (a seam: tests
        force pairs)."""
        self.consolidates = self.freed_drafters and speculation.consolidate_tail
        self.merge_workers: Callable[[Sequence[WorkerView], Mapping[int, int]], tuple[int, int] | None] = \
            self._priced_merge
        """(source, destination) member ids: a straggling worker to empty onto another so that it drafts for it,
        given the workers' state and the pairs wanted (a seam: tests force merges)."""
        self.emptied: dict[int, int] = {}
        """Member id of a worker whose samples are moving away -> the one it is to draft for once freed."""

    # ------------------------------------------------------------------ membership
    def start(self, version: int, weights: Weights | Result[Weights], history: HistoryClient,
              older: Mapping[int, Weights | Result[Weights]] | None = None,
              rounds_before: int = 0, broadcast: WeightBroadcast | None = None) -> None:
        """Bring the fleet up to the wanted size with the run's current weights (workers `reconcile`
        started before have been starting meanwhile); the scheduler's cost model from the first
        worker's measured pass times. history: where rounds get their drafting indexes; older: the
        weights of earlier versions a resumed run had in flight; rounds_before: rounds planned
        before (a resumed run numbers its rounds on); broadcast: how published versions travel
        besides the object store (None: through it alone)."""
        self.version, self.weights, self.history = version, {**(older or {}), version: weights}, history
        self.rounds, self.broadcast = rounds_before, broadcast
        if self.broadcast is not None:
            self.broadcast.publish(version, [])
        self.reconcile(wait=True)
        self._started = True
        self._last_count = (self.live_count(), max(1, self.wanted()))
        cost = self.transport.get(self.transport.call(self._live()[0].handle, RolloutAPI.cost_profile))
        if cost is not None:
            self.sched.profile = table_profile(cost, self.job.spec.rollout.max_batch_size)

    def reconcile(self, wait: bool = False) -> None:
        """Workers join and leave to match `wanted()` within the room there is; `wait`: until at least
        one worker is live."""
        while True:
            self._admit_joiners()
            want = max(1, self.wanted())
            joining = [m for m in self.members if not m.joined]
            staying = [m for m in self._live() if not m.leaving]
            excess = len(staying) + len(joining) - want
            if excess > 0:  # workers still starting go first, then those holding the least work
                for m in sorted(joining, key=lambda m: -m.id)[:excess]:
                    self._stop(m)
                for m in self._leaving_order(staying)[: max(0, excess - len(joining))]:
                    self._retire(m)
            elif excess < 0:
                capacity = self._capacity_now()  # pods that joined; every member holds one of them
                room = -excess if capacity is None else min(-excess, capacity - len(self.members))
                for _ in range(max(0, room)):
                    self.members.append(Member(next(self.ids), self.start_worker()))
                self._admit_joiners()  # those that start at once (in this process) join now
            if self._started:
                self._say_count(self.live_count(), want)
            self._report_in_use()
            if not wait or self._live():
                return
            self._wait_for_worker()

    def _admit_joiners(self) -> None:
        if not self.weights:  # workers started before `start` join once there are weights to give them
            return
        for m in [m for m in self.members if not m.joined]:
            try:
                ready = self.transport.ready(m.handle)
                host = self.transport.get(self.transport.call(m.handle, RolloutAPI.host)) if ready else None
            except WorkerGone:
                self._remove(m)
                self.note("a rollout worker died while it started")
                continue
            if ready:
                m.joined = True
                m.pod = pod_ordinal(str(host), self.job.metadata.name)
                self._load(m, self.version)
                if self.live_round is not None:
                    m.slot = self.sched.add_worker()
                    self.live_round.workers.add(m.id)
                    self._unpark(self.live_round)
                    self.executor.steal(m.slot, self.live_round.no)

    def _least_busy(self, members: list[Member]) -> list[Member]:
        """Members by the work they hold now, least first (the newest first among equals)."""
        def work(m: Member) -> tuple[int, int]:
            held = sum(len(c.tokens) for c in self._active(m))
            return held, -m.id
        return sorted(members, key=work)

    def _leaving_order(self, members: list[Member]) -> list[Member]:
        """Which members leave first when fewer are wanted: those on the highest pod ordinals (the pods a
        StatefulSet removes), then those holding the least work."""
        rank = {m.id: i for i, m in enumerate(self._least_busy(members))}
        return sorted(members, key=lambda m: (1 if m.pod is None else -m.pod, rank[m.id]))

    def pods_in_use(self) -> int | None:
        """How many leading rollout pod ordinals hold every worker of the fleet (leaving ones included
        until they are stopped): a StatefulSet at that count or more removes none of them. None: a
        worker's pod is not known (starting, or not in a cluster)."""
        if any(m.pod is None for m in self.members):
            return None
        return max((m.pod + 1 for m in self.members if m.pod is not None), default=0)

    def _report_in_use(self) -> None:
        found = self.pods_in_use()
        if found != self._in_use_said:
            self._in_use_said = found
            self.in_use(found)

    def _retire(self, m: Member) -> None:
        """Ask a worker to leave: one running a call hands its samples back first."""
        m.leaving = True
        if self._active(m):
            self.transport.tell(m.handle, RolloutAPI.leave)
        elif not self._calls_of(m):  # outputs of its calls are scored first (collect stops it then)
            self._stop(m)

    def _remove(self, m: Member) -> None:
        if m in self.members:
            self.members.remove(m)
            self._report_in_use()
        if self.broadcast is not None:
            self.broadcast.forget(m.id)

    def _stop(self, m: Member) -> None:
        self._remove(m)
        self.transport.stop(m.handle)

    def _capacity_now(self) -> int | None:
        now = time.monotonic()
        if now - self._capacity_at >= CAPACITY_EVERY_S:
            self._capacity, self._capacity_at = self.transport.capacity("rollout"), now
        return self._capacity

    def _say_count(self, live: int, want: int) -> None:
        if (live, want) != self._last_count:
            self.note(f"rollout workers: {live} of {want} wanted")
            self.say(f"running with {live} of {want} rollout workers")
            self._last_count = (live, want)

    def _wait_for_worker(self) -> None:
        """No worker takes work: wait for one to start or join, saying so (in events.log once a minute
        after the first minute, or at once once the fleet had been up)."""
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since, self._waiting_said = now, -math.inf
        if now - self._waiting_said >= WAIT_NOTE_S:
            msg = f"waiting for a rollout worker: none is live ({len(self.members)} starting, {self.wanted()} wanted)"
            self.say(msg)
            if self._started or now - self._waiting_since >= WAIT_NOTE_S:
                self.note(msg)
                self._waiting_said = now
        time.sleep(0.2)

    def live_count(self) -> int:
        """Workers in the fleet that take work (not leaving)."""
        return len([m for m in self._live() if not m.leaving])

    def _live(self) -> list[Member]:
        return [m for m in self.members if m.joined]

    def _calls_of(self, m: Member) -> list[Call]:
        return [c for c in self.by_stream.values() if c.member is m]

    def _active(self, m: Member) -> list[Call]:
        return [c for c in self._calls_of(m) if not c.ended]

    # ------------------------------------------------------------------ weights
    def publish(self, version: int, weights: Weights | Result[Weights]) -> None:
        """A new policy version: every worker loads it before its next call."""
        self.weights[version] = weights
        in_use = ({version} | {p.version for p in self.parked.values()}  # a call not collected may run again
                  | {c.version for c in self.by_stream.values()})
        for old in [v for v in self.weights if v not in in_use]:
            del self.weights[old]
        self.version = version
        if self.broadcast is not None:
            self.broadcast.publish(version, [(m.id, m.handle) for m in self._live()])
        for m in self._live():
            if not any(not c.ended for c in self._calls_of(m)):
                self._load(m, version)

    def _load(self, m: Member, version: int) -> None:
        if m.version != version:
            weights = self.weights[version]
            # a broadcast carries a worker forward only: an older version (a deferred sample's, a
            # resumed run's in-flight round) comes from the object store
            newer = m.version is None or version > m.version
            if self.broadcast is not None and newer and self.broadcast.carries(version):
                self.broadcast.ensure(version, m.id, m.handle)
                passed: Weights | WeightsRef = self.transport.deferred(weights)
            else:
                passed = self.transport.arg(weights)
            m.loads.append(self.transport.call(m.handle, RolloutAPI.load_weights, version, passed))
            m.version = version

    def weight_sync(self) -> tuple[float, int]:
        """The longest weight load of any worker since the last call (they load in parallel), and
        how many loads found no broadcast copy and took the object store's (said in the run's log)."""
        if self.broadcast is not None:
            broke = self.broadcast.failed
            self.broadcast.settle()
            if self.broadcast.failed > broke:
                self.note(f"{self.broadcast.failed - broke} weight broadcast(s) broke (a receiver gone); the other "
                          "receivers' copies arrived or their loads take the object store's")
        seconds, fell_back = 0.0, 0
        for m in self._live():
            for r in m.loads:
                if self.transport.done(r):
                    with contextlib.suppress(WorkerGone, ResultLost):
                        took, missed = self.transport.get(r)
                        seconds, fell_back = max(seconds, float(took)), fell_back + bool(missed)
            m.loads = [r for r in m.loads if not self.transport.done(r)]
        if fell_back:
            self.note(f"{fell_back} weight load(s) found no broadcast copy within "
                      f"{STAGED_WAIT_S:.0f}s and took the object store's")
        return seconds, fell_back

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
        for m in self._live():
            self.transport.tell(m.handle, RolloutAPI.end_step)

    def close(self) -> None:
        for m in list(self.members):
            self._stop(m)

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
        live = sorted([m for m in self._live() if not m.leaving], key=lambda m: m.id) or self._live()
        for slot, m in enumerate(live):
            m.slot = slot
        for m in self.members:
            if m not in live:
                m.slot = -1
        self.sched.set_workers(len(live))
        self.sched.final_round = None if inter_step else rnd.no
        rnd.started = time.perf_counter()
        rnd.clock0 = self.transport.sync([m.handle for m in live])
        rnd.workers = {m.id for m in live}
        fresh = [SampleRef(pid, k, e) for e, pid in groups for k in range(g)]
        for s in fresh:
            self.sid[s] = sid = next(self.sids)
            self.ref[sid] = s
        carried = {s: p for s, p in self.parked.items() if p.round is None}

        def version_of(s: SampleRef) -> int:
            return (versions or {}).get((s.epoch, s.prompt_id), self.version)

        plan = self.sched.plan_round(rnd.no, [Sample(self.sid[s], s.prompt_id, len(self.encoded[s.prompt_id]),
                                                    oracle_len=oracle.get(s) if oracle else None) for s in fresh])
        rnd.ranking = plan.ranking
        queues = [list(q) for q in plan.queues] or [[] for _ in live]
        for j, sid in enumerate(plan.shared):  # a shared queue is dealt round-robin
            self.sched.on_admitted(sid, j % len(live))
            queues[j % len(live)].append(sid)
        self.live_round = rnd
        for slot, queue in enumerate(queues):
            mine = [self.ref[sid] for sid in queue]
            new = [s for s in mine if s not in carried]
            if new:
                indexes = self._indexes(rnd, sorted({s.prompt_id for s in new}))
                for part in _by(new, version_of):
                    self._open(live[slot], rnd, part, indexes, version_of(part[0]), {}, {})
            moved = [s for s in mine if s in carried]
            for part in _by(moved, lambda s: (carried[s].version, id(carried[s].indexes))):
                first = carried[part[0]]
                self._open(live[slot], rnd, part, first.indexes, first.version,
                           {s: carried[s].resume for s in part}, {s: carried[s].tokens for s in part})
        for s in carried:
            del self.parked[s]
        return rnd

    def _indexes(self, rnd: Round, prompt_ids: list[str]) -> Result[Indexes] | None:
        if not self.job.spec.rollout.speculation.reads_history:
            return None
        indexes = self.history.indexes(rnd.epoch, prompt_ids, rnd.step)
        rnd.history_ok = (rnd.history_ok is not False) and indexes is not None
        return indexes

    def _open(self, m: Member, rnd: Round, samples: list[SampleRef], indexes: Result[Indexes] | None, version: int,
              resume_of: Mapping[SampleRef, Progress | None], resumed: dict[SampleRef, int]) -> Call:
        requests = [self._request_of(s) for s in samples]
        call = Call(next(self.calls), m, rnd, samples, requests, indexes, version,
                    {s: resume_of.get(s) for s in samples}, {s: resumed.get(s, 0) for s in samples})
        self._submit(call)
        rnd.calls.append(call)
        rnd.workers.add(m.id)
        return call

    def _request_of(self, s: SampleRef) -> GenRequest:
        if (p := self.parked.get(s)) is not None:
            return p.request
        return GenRequest(self.encoded[s.prompt_id], sample_key(s.prompt_id, s.epoch, s.index), s.prompt_id)

    def _submit(self, call: Call) -> None:
        """Start the call with the weights its samples began with (the worker loads them first)."""
        m = call.member
        self._load(m, call.version)
        concurrent = self.transport.concurrent
        watched = self.job.spec.rollout.max_replicas > 1 or len(self.members) > 1
        rc = RolloutCall(call.id, list(call.samples), list(call.requests), call.round.step,
                         report_every=(STATE_PASSES if concurrent else 1) if watched and self.releasable else None,
                         snapshot_every=SNAPSHOT_PASSES if concurrent and self.releasable else None,
                         share_every=STATE_PASSES if watched and self.relays_groups else None)
        call.tokens = {s: call.resumed.get(s, 0) for s in call.samples}
        call.stream = self.transport.stream(m.handle, call.id, rc, call.indexes, self._progress(call.resume_of))
        self.by_stream[id(call.stream)] = call

    def _progress(self, resume: Mapping[SampleRef, Progress | None]) -> Progress | None:
        """One object of these samples' tokens so far, each from the source it resumes from (None:
        all afresh). A single source goes as it is (a worker takes the samples it names)."""
        sources = {id(r): r for r in resume.values() if r is not None}
        if len(sources) <= 1:
            return next(iter(sources.values()), None)
        got = {k: (r if isinstance(r, RolloutProgress) else self.transport.get(r)).results for k, r in sources.items()}
        return RolloutProgress({s: got[id(r)][s] for s, r in resume.items() if r is not None and s in got[id(r)]})

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
                        self._score(c)
            if self._summaries(rnd):
                break
        rnd.scored = time.perf_counter()
        self.live_round = None
        for c in rnd.calls:
            self.by_stream.pop(id(c.stream), None)
            self.heard_for.pop(c.id, None)
        self.reports_kept = 0
        for m in [m for m in self.members if m.leaving and not self._active(m)]:
            self._stop(m)
        return [(summary, _scored(c)) for c, summary in rnd.summaries]

    def _follow(self, rnd: Round) -> None:
        """Until every call of the round has its output and no sample of it waits for a place."""
        while True:
            self.reconcile()
            live = [c for c in rnd.calls if not c.ended]
            if not live and not any(p.round is rnd for p in self.parked.values()):
                return
            if not [m for m in self._live() if not m.leaving]:
                self._wait_for_worker()
                continue
            self._waiting_since = None
            self._unpark(rnd)
            streams = [c.stream for c in live if c.stream is not None]
            try:
                report = self.transport.next_report(streams, timeout=1.0)
            except WorkerGone as gone:
                self._lost(self.by_stream[id(gone.args[0])], str(gone.args[1]) if len(gone.args) > 1 else "")
                continue
            except ResultLost as lost:
                self._restart(self.by_stream[id(lost.args[0])])
                continue
            if report is not None:
                self._on_report(self.by_stream[id(report.stream)], report)
            self._steal_for_idle(rnd)
            self._pair(rnd)

    def _on_report(self, call: Call, report: Report) -> None:
        kind, value = report.kind, report.value
        if kind == "handback":
            assert isinstance(value, Handback), value
            self._handback(call, report.progress(), value)
            return
        assert isinstance(value, CallState), (kind, value)
        if kind == "state":
            self._observe(call, value)
        elif kind == "progress":
            for s in value.running.keys() | value.finished.keys():
                call.resume_of[s] = report.progress()
                call.resumed[s] = value.running.get(s, value.finished.get(s, 0))
            self._observe(call, value)
        elif kind == "output":
            call.output, call.ended = report.output(), True
            call.round.ends[call.member.id] = self.transport.clock(call.member.handle)
            self._observe(call, value)
            if self.transport.concurrent:
                self._score(call)

    def _observe(self, call: Call, state: CallState) -> None:
        """What a call reported: finishes and token counts go to the scheduler (watched samples once
        they reach their count)."""
        if self.relays_groups:
            self._relay(call, state.grown)
        now = self.transport.clock(call.member.handle)
        mine = set(call.samples)
        call.reported = True
        call.tokens = {s: n for s, n in state.running.items() if s in mine}
        for s, length in state.finished.items():
            if s in call.finished:
                continue
            call.finished[s] = length
            call.tokens.pop(s, None)
            self.moving.pop(s, None)  # a move still asked for is refused: it finished first
            sid = self.sid.get(s)
            if sid is not None and s not in self.told:
                self.told.add(s)
                self.executor.finished(sid, call.member.slot, length, now)
        for s, generated in state.running.items():
            want = self.watches.get(s)
            if want is not None and generated >= want and s not in self.moving:
                del self.watches[s]
                self.executor.progressed(self.sid[s], call.member.slot, generated, now)

    def _relay(self, call: Call, grown: GrownTokens | None) -> None:
        """A call's block of new tokens is kept, whole, for every other running call of the round
        that runs one of its groups (same prompt, same epoch) with a sample still unfinished; once
        as many reports came in as calls run (about one from each), every call is sent the blocks
        kept for it. One message per call per report interval whatever the fleet's size (a message
        per pair of workers would grow with its square) and no work per token here; each token at
        most about one report interval old, and every worker hears its siblings' tokens of the
        same passes, as siblings in one session do (in-process, where the workers take turns, a
        sibling heard within the pass it was made would be half a pass ahead of any real fleet)."""
        live = [c for c in call.round.calls if not c.ended]
        if grown is not None:
            for other in live:
                if other is not call and not grown.groups.isdisjoint(
                        (s.epoch, s.prompt_id) for s in other.samples if s not in other.finished):
                    self.heard_for[other.id].append(grown)
        self.reports_kept += 1
        if self.reports_kept < len(live):
            return
        self.reports_kept = 0
        for other in live:
            blocks = self.heard_for.pop(other.id, None)
            if blocks:
                self.transport.tell(other.member.handle, RolloutAPI.hear, other.id, blocks)

    def _handback(self, call: Call, item: Result[RolloutProgress], hb: Handback) -> None:
        """Samples a call handed back: each goes where the move asked for it says; with the worker
        leaving, the others are parked and the scheduler spreads them over the workers that stay."""
        rnd, m = call.round, call.member
        if hb.leaving:
            m.leaving = True
            item = self.transport.keep(item)  # its worker goes: the tokens must not go with it
        for s in hb.missed:
            if (move := self.moving.pop(s, None)) is not None:
                self.executor.refused(move.sid)
        requests = dict(zip(call.samples, call.requests, strict=True))
        keep = [i for i, s in enumerate(call.samples) if s not in hb.handed]
        call.samples, call.requests = [call.samples[i] for i in keep], [call.requests[i] for i in keep]
        for s in hb.handed:
            call.tokens.pop(s, None)
        by_dst: dict[int | None, list[SampleRef]] = defaultdict(list)
        orphans = []
        for s in hb.handed:
            move = self.moving.pop(s, None)
            if move is None:
                orphans.append(s)
            else:
                by_dst[move.dst].append(s)
        for dst, moved in by_dst.items():
            for s in moved:
                self.parked[s] = Parked(requests[s], item, hb.handed[s], call.version, call.indexes,
                                        rnd if dst is not None else None, m.slot)
            if dst is not None:
                self._place(moved, self._member_at(dst), src=m)
            for s in moved:
                reason = self.executor.in_flight[self.sid[s]].reason
                rnd.counts["deferred" if dst is None else "stolen" if reason == "steal" else "migrated"] += 1
                self.executor.confirmed(Move(sid=self.sid[s], src=m.slot, dst=dst, generated=hb.handed[s]))
        if orphans:
            for s in orphans:
                self.parked[s] = Parked(requests[s], item, hb.handed[s], call.version, call.indexes, rnd, m.slot)
            rnd.counts["handed_back"] += len(orphans)
            self._unpark(rnd)

    def _unpark(self, rnd: Round) -> None:
        """Samples of this round in the fleet's hands (their worker left or died) find a place: the
        scheduler spreads those it still counts as unfinished over the workers that stay; the others
        (it heard them finish, but their results died with their worker) go to the least busy one.
        With no worker to take them they wait for one to join."""
        left = [s for s, p in self.parked.items() if p.round is rnd]
        live = [m for m in self._live() if not m.leaving and m.slot >= 0]
        if not left or not live:
            return
        booked = [s for s in left if s in self.sid and s not in self.told]
        for part in _by(booked, lambda s: self.parked[s].slot):
            self.executor.evacuate(self.parked[part[0]].slot, rnd.no,
                                   [(self.sid[s], self.parked[s].tokens) for s in part], [m.slot for m in live])
        rest = [s for s in left if s in self.parked and s not in booked]
        if rest:
            self._place(rest, self._least_busy(live)[0], src=None)

    def _member_at(self, slot: int) -> Member:
        return next(m for m in self._live() if m.slot == slot)

    def _place(self, samples: list[SampleRef], dst: Member, src: Member | None) -> None:
        """Parked samples onto `dst`: into the call it is running if that call can take them (same
        round, same weights), else a new call there, resuming from their tokens."""
        for part in _by(samples, lambda s: (self.parked[s].version, id(self.parked[s].indexes), id(self.parked[s].round))):
            p0 = self.parked[part[0]]
            rnd = p0.round or self.live_round
            assert rnd is not None
            running = [c for c in self._active(dst) if c.round is rnd and c.version == p0.version]
            if src is not None and not self._active(dst):
                self.transport.catch_up(dst.handle, src.handle)  # an idle worker cannot start it earlier
            resume = {s: self.parked[s].resume for s in part}
            tokens = {s: self.parked[s].tokens for s in part}
            if not (running and self.releasable and self._admit(running[0], part, resume, tokens)):
                self._open(dst, rnd, part, p0.indexes, p0.version, resume, tokens)
            for s in part:
                del self.parked[s]

    def _admit(self, call: Call, samples: list[SampleRef], resume: dict[SampleRef, Progress | None],
               tokens: dict[SampleRef, int]) -> bool:
        requests = [self.parked[s].request for s in samples]
        try:
            ok = self.transport.get(self.transport.call(call.member.handle, RolloutAPI.admit, call.id, samples, requests,
                                                        self.transport.arg(self._progress(resume))),
                                    timeout=ADMIT_WAIT_S)
        except (WorkerGone, TimeoutError, ResultLost):
            return False
        if ok:
            call.samples += samples
            call.requests += requests
            for s in samples:
                call.resume_of[s], call.resumed[s] = resume[s], tokens[s]
                call.tokens[s] = tokens[s]
        return bool(ok)

    # ------------------------------------------------------------------ freed drafters
    def _pair(self, rnd: Round) -> None:
        """Freed workers draft for straggling ones (rollout/remote_drafts.py): the pairs `pair_drafters`
        decides from the round's calls, each verifier's running call told its drafter's link (or
        that it has none any more)."""
        if not self.freed_drafters:
            return
        members = {m.id: m for m in self._live() if not m.leaving and m.slot >= 0}
        running: dict[int, Call] = {}
        views = []
        for m in members.values():
            calls = self._active(m)
            if not calls:
                continue
            running[m.id] = calls[0]
            views.append(self._view(m, calls))
        freed = sorted(i for i in members if i not in running and i in rnd.workers)
        current = {**self.emptied, **{d: v for d, (v, _) in self.drafting.items()}}
        wanted = {d: v for d, v in self.pair_drafters(views, freed, current).items()
                  if d in members and d not in running and v in running}
        self.emptied = {d: v for d, v in self.emptied.items() if d in running and v in running}
        if self.consolidates and not self.moving and not self.emptied:
            self._consolidate(rnd, members, running, views, wanted)
        for d, (v, call_id) in list(self.drafting.items()):
            call = running.get(v)
            if wanted.get(d) != v or call is None or call.id != call_id:
                del self.drafting[d]
                if call is not None and call.id == call_id:
                    self.transport.tell(call.member.handle, RolloutAPI.draft_from, call_id, None)
        for d, v in wanted.items():
            if d not in self.drafting:
                call = running[v]
                self.drafting[d] = (v, call.id)
                link = self.transport.draft_link(members[d].handle, f"{v}:{call.id}:{d}")
                self.transport.tell(call.member.handle, RolloutAPI.draft_from, call.id, link)
                self.note(f"rollout worker {d} drafts for rollout worker {v} (step {rnd.step}; freed drafters)")
        rnd.drafting = max(rnd.drafting, len(self.drafting))

    def _consolidate(self, rnd: Round, members: Mapping[int, Member], running: Mapping[int, Call],
                     views: Sequence[WorkerView], wanted: Mapping[int, int]) -> None:
        """Where `merge_workers` says so, every unfinished sample of one straggling worker moves to
        another (through the executor, booked as rebalances; the samples keep their tokens), and the
        emptied worker, once its call has handed them over, drafts for the one it filled (SPECATOR §4.2's
        consolidation; the rule: freed_drafters.consolidation). Only a worker whose every running call
        is of this round, and has reported (a worker drops a release for a call it has not begun):
        emptied, it is freed."""
        merge = self.merge_workers(views, wanted)
        if merge is None:
            return
        src, dst = merge
        if src not in running or dst not in running or src == dst \
                or any(c.round is not rnd or not c.reported for c in self._active(members[src])):
            return
        samples = self.unfinished(members[src].slot, rnd.no)
        if not samples:
            return
        self.emptied[src] = dst
        rnd.consolidations += 1
        self.note(f"rollout worker {src} hands its {len(samples)} samples to rollout worker {dst} and drafts for it "
                  f"(step {rnd.step}; freed drafters)")
        self.executor.consolidate([Move(sid=sid, src=members[src].slot, dst=members[dst].slot, generated=n,
                                        recompute=True) for sid, n in samples])

    def _view(self, m: Member, calls: list[Call]) -> WorkerView:
        """A worker as the drafter decision sees it: its unfinished samples (those beyond its batch
        queued), their mean context as last reported, and as its remaining work as many tokens again as
        its longest-running sample has made (work stealing's fallback, as in the simulator)."""
        left = [(c, i) for c in calls for i, s in enumerate(c.samples) if s not in c.finished]
        tokens = [c.tokens.get(c.samples[i], c.resumed.get(c.samples[i], 0)) for c, i in left]
        context = sum(len(c.requests[i].prompt_ids) for c, i in left) + sum(tokens)
        batch = self.job.spec.rollout.max_batch_size
        return WorkerView(m.id, min(len(left), batch), max(0, len(left) - batch), context / max(len(left), 1),
                          float(max([1, *tokens])))

    def _priced_pairs(self, views: Sequence[WorkerView], freed: Sequence[int],
                      current: Mapping[int, int]) -> dict[int, int]:
        """freed_drafters.assign on the costs of `_draft_costs`."""
        priced = self._draft_costs()
        return {} if priced is None else assign(views, freed, current, *priced)

    def _priced_merge(self, views: Sequence[WorkerView], wanted: Mapping[int, int]) -> tuple[int, int] | None:
        """freed_drafters.consolidation on the costs the pairs are decided on."""
        priced = self._draft_costs()
        return None if priced is None else consolidation(views, wanted, *priced)

    def _draft_costs(self) -> tuple[IterationProfile, DraftCosts] | None:
        """The pass times and drafting costs the drafter decisions price: the fleet's measured pass
        times (None before they are measured), the draft model's steps at DRAFT_STEP_COST of a policy
        pass; forced (faults.forced), passes that cost the same whatever they verify and drafts that
        cost nothing and are almost always right, so every straggling worker a freed one can serve
        pays, and so does every merge that fits one drafter."""
        if faults.forced("freed-drafters"):
            flat = TableProfile.constant(max_batch=self.job.spec.rollout.max_batch_size)
            return flat, DraftCosts(acceptance=0.99, message_s=0.0, draft_profile=ScaledProfile(flat, 0.0),
                                    consolidate=self.consolidates)
        if self.sched.profile is None:
            return None
        return self.sched.profile, DraftCosts(draft_profile=ScaledProfile(self.sched.profile, DRAFT_STEP_COST),
                                              consolidate=self.consolidates)

    def _steal_for_idle(self, rnd: Round) -> None:
        for m in self._live():
            if not m.leaving and m.slot >= 0 and not self._active(m) and m.id in rnd.workers:
                self.executor.steal(m.slot, rnd.no)

    def forget(self, samples: Sequence[SampleRef]) -> None:
        """Samples whose groups trained: their books close."""
        for s in samples:
            if (sid := self.sid.pop(s, None)) is not None:
                del self.ref[sid]
            self.told.discard(s)
            self.watches.pop(s, None)
            self.losses.pop(s, None)

    # ------------------------------------------------------------------ the executor's fleet
    def watch(self, sid: SampleId, tokens: int) -> None:
        s = self.ref[sid]
        self.watches[s] = tokens
        for c in self.by_stream.values():
            if not c.ended and c.tokens.get(s, -1) >= tokens and s not in self.moving:
                del self.watches[s]
                self.executor.progressed(sid, c.member.slot, c.tokens[s], self.transport.clock(c.member.handle))
                return

    def request(self, move: Move) -> None:
        s = self.ref[move.sid]
        if s in self.parked:  # in the fleet's hands already: placed now
            p = self.parked[s]
            if move.dst is None:
                p.round = None
            else:
                self._place([s], self._member_at(move.dst), src=None)
            self.executor.confirmed(Move(sid=move.sid, src=move.src, dst=move.dst, generated=p.tokens))
            return
        holder = [c for c in self.by_stream.values() if not c.ended and s in c.tokens]
        if not holder or not self.releasable or holder[0].member.leaving:
            self.executor.refused(move.sid)
            return
        self.moving[s] = move
        self.transport.tell(holder[0].member.handle, RolloutAPI.release, holder[0].id, [s])

    def unfinished(self, worker: int, step: int) -> Sequence[tuple[SampleId, int]]:
        out: list[tuple[SampleId, int]] = []
        for c in self.by_stream.values():
            if not c.ended and c.member.slot == worker and c.round.no == step and not c.member.leaving:
                out += [(self.sid[s], n) for s, n in c.tokens.items()
                        if s in self.sid and s not in self.moving and s not in self.told]
        return out

    # ------------------------------------------------------------------ faults
    def _lost(self, call: Call, why: str) -> None:
        """The worker of `call` died: every call of it that had not ended is resumed elsewhere from
        the tokens its samples had at their last snapshot."""
        m = call.member
        self._remove(m)
        self.transport.stop(m.handle)
        for c in [c for c in self.by_stream.values() if c.member is m and not c.ended]:
            c.ended = True
            self.reruns += 1
            rnd = c.round
            for s, request in zip(c.samples, c.requests, strict=True):
                if (move := self.moving.pop(s, None)) is not None:
                    self.executor.refused(move.sid)
                self.losses[s] += 1
                if self.losses[s] > RERUNS:
                    raise WorkerLost(f"step {rnd.step}: sample {s.index} of prompt {s.prompt_id} lost its rollout "
                                     f"worker {self.losses[s]} times (last: {why})")
                self.parked[s] = Parked(request, c.resume_of.get(s), c.resumed.get(s, 0),
                                        c.version, c.indexes, rnd, m.slot)
            self.note(f"step {rnd.step}: rollout worker {m.id} died ({why or 'no notice'}); its {len(c.samples)} "
                      f"samples go on elsewhere from the tokens they had (policy version {c.version})")
            rnd.counts["handed_back"] += len(c.samples)
            self._unpark(rnd)

    def _restart(self, call: Call) -> None:
        """Objects a call needed (the tokens it resumes from) or made (its output) died with the
        worker that held them: it runs again from the start, on the least busy worker
        (position-keyed sampling: the same tokens)."""
        call.ended, call.output = True, None
        self.by_stream.pop(id(call.stream), None)
        if call in call.round.calls:
            call.round.calls.remove(call)
        live = [m for m in self._live() if not m.leaving]
        member = call.member if call.member in live or not live else self._least_busy(live)[0]
        self.note(f"step {call.round.step}: the tokens {len(call.samples)} samples had were lost with their "
                  "worker; they are generated again from the start")
        again = Call(next(self.calls), member, call.round, call.samples, call.requests, call.indexes,
                     call.version, dict.fromkeys(call.samples), dict.fromkeys(call.samples, 0))
        call.round.calls.append(again)
        self._submit(again)

    # ------------------------------------------------------------------ scoring
    def _score(self, call: Call) -> None:
        reward = self.reward[call.id % len(self.reward)]
        assert call.output is not None, "scored before its output came"
        call.scored, call.summary = self.transport.call2(reward, RewardAPI.score, self.transport.arg(call.output),
                                                         call.round.step)

    def _summaries(self, rnd: Round) -> bool:
        """Every call's summary into `rnd.summaries`; a reward worker that died scores again. False if
        a call's output died with its worker before it was scored: that call runs again."""
        out = []
        for c in rnd.calls:
            if c.output is None:
                continue
            for attempt in range(RERUNS + 1):
                try:
                    assert c.summary is not None, "a call's output is scored as it comes"
                    summary = self.transport.get(c.summary)
                    break
                except ResultLost:
                    self._restart(c)
                    return False
                except WorkerGone as exc:
                    if attempt == RERUNS:
                        raise WorkerLost(f"step {rnd.step}: scoring rollout worker {c.member.id}'s samples failed "
                                         f"{attempt + 1} times: {exc}") from exc
                    self.reruns += 1
                    self.note(f"step {rnd.step}: a reward worker died; scoring rollout worker {c.member.id}'s "
                              f"{len(c.samples)} samples again")
                    self.transport.wait_alive(self.reward[c.id % len(self.reward)])
                    self._score(c)
            out.append((c, summary))
        rnd.summaries = out
        return True


def _scored(call: Call) -> Result[list[ScoredSample]]:
    assert call.scored is not None, "a summarised call was scored"
    return call.scored


def _by(items: list[SampleRef], key: Callable[[SampleRef], Any]) -> list[list[SampleRef]]:
    """`items` in groups of equal key, in order of first appearance."""
    groups: dict[Any, list[SampleRef]] = {}
    for s in items:
        groups.setdefault(key(s), []).append(s)
    return list(groups.values())
