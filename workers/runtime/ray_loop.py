"""The step loop on Ray: the algorithm of workers/controller/loop.py, with each role a worker.

Per round of a step the controller asks the history worker for the indexes of each rollout
worker's prompts and the rollout workers for their share of the samples (placed by the job's
scheduling policy); each rollout output goes by reference to a reward worker, whose scored
samples go by reference to the train worker and the history worker. The controller receives
only summaries (lengths, rewards, speculation counts), from which it keeps DAPO's groups, the
length history and the metrics.

Weights: after each update the train worker's new weights go, by reference, to every rollout
worker, which loads them before its next call (calls to one worker run in order). With
`max_off_policy_steps: 0` the next rollout starts after that, and the tokens are those of the
in-process loop (position-keyed sampling, the same batches). With >= 1 the first round of step
n+1 is started before step n trains, so rollout overlaps training and its samples are one policy
version behind (recorded per sample in the dumps, `policy_lag_max` in the metrics).

Work stealing: a rollout worker that has finished its calls of a round takes over half of the
unfinished samples of the busiest call, with their tokens (`_steal`; the call hands them back at
its next pass, `RolloutWorker.release`), so one long call no longer holds the round while other
workers sit idle.

Outlier migration (RhymeRL §6.3): with HistoPipe the run keeps one scheduler object, fed each
call's token counts and finishes as they stream in (`_observe`); its moves are carried out by
asking the source call to hand the sample back (`_carry_out`, `_moved`): within the round the
sample joins the destination worker's running call (`RolloutWorker.admit`), across rounds it goes
on in the next one with the weights it began with. A group trains in the step its last response
finishes (`collect`, `take_groups`).

Faults: a rollout or reward worker that dies is restarted by Ray; the call it was running is run
again on it (a rollout with the weights it was started with), so every sample is generated and
scored exactly once as far as the step is concerned. A history worker (or its store) that cannot
answer within HISTORY_WAIT_S leaves that call without history drafts (`history_ok: false`).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ray
import ray.exceptions
import torch

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.factory import make_scheduler
from rhymerl.algorithms.scheduling.history import LengthHistory
from rhymerl.algorithms.scheduling.types import Action, Move, Sample, Watch
from rhymerl.api import RLJob
from rhymerl.errors import UserError
from rhymerl.workers import dumps, faults
from rhymerl.workers.controller.loop import GroupSummary, step_metrics
from rhymerl.workers.controller.prompts import Prompt, epoch_order, load_prompts
from rhymerl.workers.controller.rollout_pool import PoolReport
from rhymerl.workers.controller.run_dir import LoopState, RunDir
from rhymerl.workers.controller.step_metrics import StepMetrics
from rhymerl.workers.controller.stopping import GracefulStop
from rhymerl.workers.reward.outcome import check_failures
from rhymerl.workers.rollout.engine import GenRequest
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.runtime.actors import (
    CallState,
    ChunkSummary,
    GroupKey,
    HistoryWorker,
    RewardWorker,
    RolloutProgress,
    RolloutWorker,
    SampleRef,
    SampleSummary,
    StepLayout,
    TrainWorker,
    encode_prompts,
    load_job_tokenizer,
)
from rhymerl.workers.runtime.cluster import local_ray, spawn

HISTORY_WAIT_S = 10.0
STEAL_MIN = 2  # unfinished samples a busy call must hold before an idle worker takes half of them
RERUNS = 3  # times one rollout or reward call is run again after its worker died
START_TIMEOUT_S = 600.0  # a worker's start-up (loading the model, measuring the verify cost)


class WorkerLost(RuntimeError):
    """A worker died more often than RERUNS within one call."""


@dataclass
class Workers:
    rollout: list[Any]
    reward: list[Any]
    train: Any
    history: Any

    @classmethod
    def start(cls, job: RLJob, run_path: str | None, threads: int) -> Workers:
        """The run's workers, one per pod of each role. The history worker starts later (`start_history`):
        on resume it reads the dumps the train worker's restore has cut back."""
        spec = job.spec
        n_reward = spec.reward.replicas if spec.reward.function is not None else 1
        return cls(rollout=[spawn(RolloutWorker, "rollout", job, threads) for _ in range(spec.rollout.replicas)],
                   reward=[spawn(RewardWorker, "reward" if spec.reward.function is not None else "controller", job)
                           for _ in range(n_reward)],
                   train=spawn(TrainWorker, "train", job, run_path, threads), history=None)

    def start_history(self, job: RLJob) -> None:
        train = self.train
        self.history = spawn(HistoryWorker, "history", job, lambda: ray.get(train.history_records.remote()))

    def ready(self, run: RunDir) -> None:
        """Wait for every worker's start-up; a history worker that fails to start (its store is
        down) is noted, and the run goes on without history drafts."""
        ray.get([w.ping.remote() for w in [*self.rollout, *self.reward, self.train]], timeout=START_TIMEOUT_S)
        try:
            ray.get(self.history.ping.remote(), timeout=START_TIMEOUT_S)
        except ray.exceptions.RayError as exc:
            run.note(f"the history worker did not start ({why(exc)}); rolling out without history drafts "
                     "until it does")

    def stop(self) -> None:
        for w in self.reward:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(w.close.remote(), timeout=30)
        for w in [*self.rollout, *self.reward, self.train, self.history]:
            if w is not None:
                ray.kill(w, no_restart=True)


@dataclass
class Chunk:
    """One rollout call's samples, and the references its results travel under."""

    worker: int
    samples: list[SampleRef]
    requests: list[GenRequest]
    indexes: Any  # reference to the history worker's indexes, or None
    version: int
    progress: Any = None  # reference to the latest progress confirmed (or the moved samples' partials)
    call: int = -1  # id of the rollout call now running it
    stream: Any = None  # that call's item stream (actors.RolloutWorker.generate)
    items: Any = None  # the stream's iterator
    unfinished: int = 0  # samples still running at the last progress report
    thief: int | None = None  # the idle worker a release was asked for, until the call answers
    broken: bool = False  # the stream broke off: _summary runs the call again
    output: Any = None
    scored: Any = None
    summary: Any = None

    def remove(self, gone: set[SampleRef]) -> None:
        keep = [i for i, s in enumerate(self.samples) if s not in gone]
        self.samples, self.requests = [self.samples[i] for i in keep], [self.requests[i] for i in keep]


class _Died(Exception):
    """The rollout worker of a chunk died before its output was confirmed."""


@dataclass
class Round:
    step: int
    epoch: int
    order: list[str]  # the prompts it launched
    chunks: list[Chunk]
    history_ok: bool | None
    summaries: list[ChunkSummary] = field(default_factory=list)
    stolen: int = 0  # samples idle workers took over from busy ones
    migrated: int = 0  # outliers moved to another worker's call (intra-step)
    deferred: int = 0  # outliers moved to the next round (inter-step)

    def report(self, workers: int) -> PoolReport:
        """Each worker's busy time (its calls back to back) and the round's makespan."""
        busy = [0.0] * workers
        for c, summary in zip(self.chunks, self.summaries, strict=True):
            busy[c.worker] += summary.rollout_seconds
        return PoolReport(busy, max(busy), migrated=self.migrated, stolen=self.stolen)


@dataclass
class Deferred:
    """An outlier moved to the next round: it goes on there with the weights it started with."""

    request: GenRequest
    partials: Any  # reference to a RolloutProgress holding its tokens so far
    version: int
    indexes: Any


@dataclass
class Finished:
    summary: SampleSummary
    version: int
    chunk: Chunk


class Controller:
    """Drives the workers through the job's steps; holds only summaries and references."""

    def __init__(self, job: RLJob, run: RunDir, workers: Workers, first_plan: int = 0) -> None:
        self.job, self.run, self.w = job, run, workers
        spec = job.spec
        self.prompts = load_prompts(spec.data)
        self.by_id = {p.prompt_id: p for p in self.prompts}
        self.encoded = encode_prompts(load_job_tokenizer(job), self.prompts)
        self.lengths = LengthHistory()
        self.version = 0
        self.weights: dict[int, Any] = {}  # policy version -> reference to its weights (those in use)
        self.reruns = 0
        self.history_down: str | None = None  # why the history worker cannot serve, while it cannot
        self.pending_records: list[tuple[int, Any]] = []
        self.calls = itertools.count()
        self.plans = first_plan  # rounds planned so far (the scheduler numbers its plans)
        torch_engine = spec.rollout.engine == "torch" and len(workers.rollout) > 1
        # HistoPipe's work stealing, of started samples too: an idle worker takes over half of a busy
        # call's unfinished samples with their tokens (position-keyed sampling: they go on as they
        # would have); vLLM calls cannot hand samples back mid-call
        self.stealing = spec.scheduling.policy == "histopipe" and spec.scheduling.work_stealing and torch_engine
        # HistoPipe's outlier migration (RhymeRL §6.3) by the same scheduler object as in-process and in
        # the simulator, fed the workers' progress reports; inter-step only where a later round can
        # take the outlier (max_off_policy_steps >= 1)
        self.sched: Scheduler | None = None
        if spec.scheduling.policy == "histopipe" and spec.scheduling.migration.enabled and torch_engine:
            self.sched = make_scheduler(spec.scheduling, len(workers.rollout), seed=spec.rollout.seed,
                                        max_off_policy=spec.algorithm.max_off_policy_steps, history=self.lengths,
                                        learns_lengths=False)
        self.sids = itertools.count()
        self.sid: dict[SampleRef, int] = {}
        self.ref: dict[int, SampleRef] = {}
        self.watch: dict[SampleRef, int] = {}  # tokens at which the scheduler wants to hear of a sample
        self.moving: dict[SampleRef, Move] = {}  # moves asked of a worker, not yet answered
        self.deferred: dict[SampleRef, Deferred] = {}
        self.open: dict[GroupKey, None] = {}  # groups launched and not yet complete, in launch order
        self.finished: dict[SampleRef, Finished] = {}  # scored samples of open groups
        self.told: set[SampleRef] = set()  # samples whose finish the scheduler has heard of
        self.running: list[Round] = []  # rounds launched whose calls may still need their weights

    # ------------------------------------------------------------------ weights
    def publish(self, version: int, weights: Any) -> None:
        """Every rollout worker loads `weights` before its next call."""
        self.weights[version] = weights
        self.running = [r for r in self.running if any(c.output is None or c.broken for c in r.chunks)]
        in_use = ({version - 1} | {d.version for d in self.deferred.values()}
                  | {c.version for r in self.running for c in r.chunks})
        for old in [v for v in self.weights if v < version and v not in in_use]:
            del self.weights[old]
        self.version = version
        for r in self.w.rollout:
            r.load_weights.remote(version, weights)

    # ------------------------------------------------------------------ rounds
    def launch(self, prompts: Sequence[Prompt], epoch: int, step: int, inter_step: bool,
               again: Sequence[GroupKey] = ()) -> Round:
        """Start a round: `prompts`' groups of `epoch`, the groups `again` (whole: a resumed run's
        groups whose outliers were deferred past its checkpoint) and the outliers deferred to it.
        inter_step: whether outliers of this round may be deferred to a later one."""
        g = self.job.spec.algorithm.group_size
        keys = [*again, *[(epoch, p.prompt_id) for p in prompts]]
        fresh = [SampleRef(pid, k, e) for e, pid in keys for k in range(g)]
        for key in keys:
            self.open[key] = None
        carried = list(self.deferred)
        samples = fresh + carried
        history_ok: bool | None = None
        chunks = []
        self.plans += 1
        for w, picked in enumerate(self.place(self.plans, samples, inter_step)):
            mine = [samples[i] for i in picked]
            parts = [[s for s in mine if s not in self.deferred], [s for s in mine if s in self.deferred]]
            for part in (p for p in parts if p):
                moved = part[0] in self.deferred
                version = self.deferred[part[0]].version if moved else self.version
                if self.job.spec.rollout.speculation.method != "history":
                    indexes = None
                elif moved:
                    indexes = self.deferred[part[0]].indexes
                else:
                    indexes = self.indexes(epoch, sorted({s.prompt_id for s in part}), step)
                    history_ok = (history_ok is not False) and indexes is not None
                chunk = Chunk(w, part, [self.request(s) for s in part], indexes, version)
                if moved:
                    chunk.progress = self.partials([self.deferred[s] for s in part])
                self.submit(chunk, step)
                chunks.append(chunk)
        self.deferred.clear()
        rnd = Round(step, epoch, [p.prompt_id for p in prompts], chunks, history_ok)
        self.running.append(rnd)
        return rnd

    def request(self, s: SampleRef) -> GenRequest:
        if s in self.deferred:
            return self.deferred[s].request
        return GenRequest(self.encoded[s.prompt_id], sample_key(s.prompt_id, s.epoch, s.index), s.prompt_id)

    @staticmethod
    def partials(deferred: Sequence[Deferred]) -> Any:
        """One progress object from the deferred samples' partial results (a few outliers' tokens)."""
        merged: dict[SampleRef, Any] = {}
        for part in ray.get(list({id(d.partials): d.partials for d in deferred}.values())):
            merged |= part.results
        return ray.put(RolloutProgress(merged))

    def indexes(self, epoch: int, prompt_ids: list[str], step: int) -> Any:
        """A reference to the history worker's indexes of these prompts, or None if it cannot serve
        them in HISTORY_WAIT_S. A history worker that died for good (its store was down when it
        started) is replaced, so history drafting comes back with the store."""
        ref, served = self.w.history.indexes.options(num_returns=2).remote(epoch, prompt_ids, step)
        ready, _ = ray.wait([served], timeout=HISTORY_WAIT_S)
        failure = _failure(served) if ready else (f"no answer within {HISTORY_WAIT_S:.0f}s", False)
        if failure is None:
            if self.history_down is not None:
                self.run.note(f"step {step}: the history worker serves indexes again")
            self.history_down = None
            return ref
        problem, dead = failure
        if self.history_down is None:
            self.run.note(f"step {step}: the history worker cannot serve indexes ({problem}); rolling out "
                          "without history drafts until it can")
        self.history_down = problem
        if dead:
            self.w.start_history(self.job)
        return None

    def submit(self, chunk: Chunk, step: int, restarted: bool = False) -> None:
        """Start the chunk's rollout call with the weights it was placed with (its worker may hold
        newer ones by now, or, `restarted`, only the model folder's; the current ones follow)."""
        rollout = self.w.rollout[chunk.worker]
        if restarted or chunk.version != self.version:
            rollout.load_weights.remote(chunk.version, self.weights[chunk.version])
        chunk.call = next(self.calls)
        chunk.stream = rollout.generate.options(num_returns="streaming").remote(
            chunk.samples, chunk.requests, chunk.indexes, step, chunk.progress, chunk.call, self.sched is not None)
        chunk.items, chunk.broken, chunk.thief = iter(chunk.stream), False, None
        if chunk.version != self.version:
            rollout.load_weights.remote(self.version, self.weights[self.version])

    def score(self, chunk: Chunk, step: int) -> None:
        reward = self.w.reward[chunk.worker % len(self.w.reward)]
        chunk.scored, chunk.summary = reward.score.options(num_returns=2).remote(chunk.output, step)

    def collect(self, rnd: Round) -> list[tuple[GroupKey, GroupSummary]]:
        """Wait for the round's summaries, running again what a dead worker left undone; return the
        groups it completed (its own, and earlier ones whose deferred outliers it finished)."""
        if self.stealing or self.sched is not None:
            self._stream(rnd)
        rnd.summaries = [self._summary(c, rnd) for c in rnd.chunks]
        for c, summary in zip(rnd.chunks, rnd.summaries, strict=True):
            for s in summary.samples:
                if s.sample in self.finished:
                    raise RuntimeError(f"sample {s.sample}: scored twice")
                self.finished[s.sample] = Finished(s, summary.policy_version, c)
        g = self.job.spec.algorithm.group_size
        done = [key for key in self.open if all(SampleRef(key[1], k, key[0]) in self.finished for k in range(g))]
        out = []
        for key in done:
            del self.open[key]
            ss = [self.finished[SampleRef(key[1], k, key[0])].summary for k in range(g)]
            grp = GroupSummary(key[1], [s.length for s in ss], [s.reward for s in ss], [s.error for s in ss],
                               sum(s.drafted for s in ss), sum(s.accepted for s in ss),
                               sum(s.forward_passes for s in ss))
            self.lengths.observe(grp.prompt_id, grp.lengths)
            out.append((key, grp))
        return out

    def take_groups(self, keys: Sequence[GroupKey]) -> tuple[list[Any], int]:
        """The scored chunks holding these (complete) groups' responses, and the oldest policy version
        among them; the groups' books are closed."""
        g = self.job.spec.algorithm.group_size
        chunks: dict[int, Chunk] = {}
        versions = []
        for epoch, pid in keys:
            for k in range(g):
                s = SampleRef(pid, k, epoch)
                f = self.finished.pop(s)
                chunks[id(f.chunk)] = f.chunk
                versions.append(f.version)
                if (sid := self.sid.pop(s, None)) is not None:
                    del self.ref[sid]
                self.told.discard(s)
                self.watch.pop(s, None)
        return [c.scored for c in chunks.values()], min(versions, default=self.version)

    def _stream(self, rnd: Round) -> None:
        """Follow every call of the round until its output (scored at once), feeding the scheduler
        its progress and letting each worker that has finished its calls take over samples from the
        busiest one. A stream that breaks off is left to `_summary`, which runs the call again."""
        while live := [c for c in rnd.chunks if c.output is None and not c.broken]:
            streams = {id(c.stream): c for c in live}
            ready, _ = ray.wait([c.stream for c in live], num_returns=1)
            chunk = streams[id(ready[0])]
            try:
                if self._advance(chunk, rnd) == "output":
                    self.score(chunk, rnd.step)
            except _Died:
                chunk.broken = True
            if self.stealing:
                self._steal(rnd)

    def _steal(self, rnd: Round) -> None:
        """Ask the call with the most unfinished samples to release half of them for each idle worker."""
        running = [c for c in rnd.chunks if c.output is None and not c.broken]
        # a worker whose call broke off is restarting: its call runs again there (`_summary`)
        busy = {c.worker for c in rnd.chunks if c.output is None} | {c.thief for c in running if c.thief is not None}
        for worker in (w for w in range(len(self.w.rollout)) if w not in busy):
            victims = [c for c in running if c.thief is None and c.unfinished >= STEAL_MIN]
            if not victims:
                return
            victim = max(victims, key=lambda c: (c.unfinished, -c.worker))
            victim.thief = worker
            self.w.rollout[victim.worker].release.remote(victim.call, victim.unfinished // 2)

    def _take_over(self, victim: Chunk, partials: Any, released: list[SampleRef], rnd: Round) -> None:
        """The samples `victim`'s call released become a chunk of the idle worker it was asked for,
        resuming from `partials` (their tokens so far)."""
        thief, victim.thief = victim.thief, None
        if not released:
            return
        if thief is None:  # no release was asked of this call: its own worker takes them back, none is lost
            thief = victim.worker
        moved = set(released)
        for s in moved & self.moving.keys():  # stolen before the call saw the move: it was not moved
            self.sched.on_move_failed(self.moving.pop(s))  # type: ignore[union-attr]
        chunk = Chunk(thief, [s for s in victim.samples if s in moved],
                      [r for s, r in zip(victim.samples, victim.requests, strict=True) if s in moved],
                      victim.indexes, victim.version, progress=partials)
        victim.remove(moved)
        rnd.chunks.append(chunk)
        rnd.stolen += len(released)
        if self.sched is not None and thief != victim.worker:
            self.sched.on_moved([Move(self.sid[s], victim.worker, thief, 0) for s in released])
        self.submit(chunk, rnd.step)

    # ------------------------------------------------------------------ migration
    def _observe(self, chunk: Chunk, state: CallState, rnd: Round) -> None:
        """Feed the scheduler what a call reported: finished samples, and watched ones that reached
        their token count; carry out what it answers."""
        if self.sched is None:
            return
        for s, length in state.finished.items():
            if (sid := self.sid.get(s)) is None or s in self.told:
                continue
            if (move := self.moving.pop(s, None)) is not None:
                self.sched.on_move_failed(move)  # it finished before the worker could hand it over
            self.told.add(s)
            self._carry_out(self.sched.on_sample_finished(sid, chunk.worker, length, 0.0), rnd)
        for s, generated in state.running.items():
            if (want := self.watch.get(s)) is not None and generated >= want and s not in self.moving:
                del self.watch[s]
                self._carry_out(self.sched.on_progress(self.sid[s], chunk.worker, generated, 0.0), rnd)

    def _carry_out(self, actions: Sequence[Action], rnd: Round) -> None:
        for a in actions:
            if isinstance(a, Watch):
                self.watch[self.ref[a.sid]] = a.tokens
            elif isinstance(a, Move):
                s = self.ref[a.sid]
                holder = [c for c in rnd.chunks if s in c.samples and c.output is None and not c.broken]
                if not holder:  # its call broke off: it goes on where it is when the call runs again
                    self.sched.on_move_failed(a)  # type: ignore[union-attr]
                    continue
                self.moving[s] = a
                self.w.rollout[holder[0].worker].release.remote(holder[0].call, 0, [s])
            else:
                raise RuntimeError(f"the Ray runtime cannot carry out {a}")

    def _moved(self, src: Chunk, partials: Any, answer: tuple[list[SampleRef], list[SampleRef]], rnd: Round) -> None:
        """A call handed back samples to be moved (and names those that had finished): intra-step
        ones join the destination worker's running call (or start one there), inter-step ones wait
        for the next round."""
        handed, missed = answer
        for s in missed:
            if (move := self.moving.pop(s, None)) is not None:
                self.sched.on_move_failed(move)  # type: ignore[union-attr]
        if not handed:
            return
        requests = dict(zip(src.samples, src.requests, strict=True))
        src.remove(set(handed))
        by_dst: dict[int | None, list[SampleRef]] = {}
        for s in handed:
            by_dst.setdefault(self.moving.pop(s).dst, []).append(s)
        for dst, moved in by_dst.items():
            reqs = [requests[s] for s in moved]
            if dst is None:
                for s, r in zip(moved, reqs, strict=True):
                    self.deferred[s] = Deferred(r, partials, src.version, src.indexes)
                rnd.deferred += len(moved)
                continue
            rnd.migrated += len(moved)
            if not self._admit(dst, moved, reqs, partials, src.version, rnd):
                chunk = Chunk(dst, moved, reqs, src.indexes, src.version, progress=partials)
                rnd.chunks.append(chunk)
                self.submit(chunk, rnd.step)

    def _admit(self, dst: int, samples: list[SampleRef], requests: list[GenRequest], partials: Any,
               version: int, rnd: Round) -> bool:
        """Add moved samples to the call `dst` is running, if it runs one with the same weights."""
        running = [c for c in rnd.chunks if c.worker == dst and c.output is None and not c.broken]
        if not running:
            return False
        target = min(running, key=lambda c: c.call)  # a worker runs its calls in order
        if target.version != version:
            return False
        try:
            ok = ray.get(self.w.rollout[dst].admit.remote(target.call, samples, requests, partials),
                         timeout=HISTORY_WAIT_S)
        except ray.exceptions.RayError:
            return False
        if ok:
            target.samples += samples
            target.requests += requests
        return bool(ok)

    def _summary(self, chunk: Chunk, rnd: Round) -> ChunkSummary:
        step = rnd.step
        for attempt in range(RERUNS + 1):
            try:
                if chunk.output is None:
                    self._follow(chunk, rnd)
                    self.score(chunk, step)
                summary: ChunkSummary = ray.get(chunk.summary)
                return summary
            except (_Died, ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
                role = "rollout" if chunk.output is None else "reward"
                if attempt == RERUNS:
                    raise WorkerLost(f"step {step}: the {role} call of rollout worker {chunk.worker}'s samples "
                                     f"failed {attempt + 1} times: {exc}") from exc
                self.reruns += 1
                if chunk.output is None:
                    self.run.note(f"step {step}: rollout worker {chunk.worker} died; its {len(chunk.samples)} "
                                  "samples go on from the tokens they had (policy version "
                                  f"{chunk.version}{'' if chunk.progress is not None else ', from the start'})")
                    self._rerun_rollout(chunk, step)
                else:
                    self.run.note(f"step {step}: a reward worker died; scoring rollout worker {chunk.worker}'s "
                                  f"{len(chunk.samples)} samples again")
                    wait_alive(self.w.reward[chunk.worker % len(self.w.reward)])
                    self.score(chunk, step)
        raise AssertionError("unreachable")

    def _follow(self, chunk: Chunk, rnd: Round) -> None:
        """Read the stream until its output; raise _Died if it breaks off first."""
        while self._advance(chunk, rnd) != "output":
            pass

    def _advance(self, chunk: Chunk, rnd: Round) -> str:
        """Read the stream's next item and its tag (small), keeping references to the progress it
        reported and to the output, handing released samples over; raise _Died if it broke off."""
        item = next(chunk.items, None)
        if item is None:
            raise _Died("the rollout stream ended without its output")
        tag_ref = next(chunk.items, None)
        try:
            if tag_ref is None:
                ray.get(item)  # the call's error, if it raised one
                raise _Died("the rollout stream ended early")
            kind, value = ray.get(tag_ref)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
            raise _Died(why(exc)) from exc
        if kind == "progress":
            chunk.progress, chunk.unfinished = item, len(value.running)
            self._observe(chunk, value, rnd)
        elif kind == "released":
            self._take_over(chunk, item, value, rnd)
        elif kind == "state":
            chunk.unfinished = len(value.running)
            self._observe(chunk, value, rnd)
        elif kind == "migrated":
            self._moved(chunk, item, value, rnd)
        elif kind == "output":
            chunk.output = item
            self._observe(chunk, value, rnd)
        return str(kind)

    def _rerun_rollout(self, chunk: Chunk, step: int) -> None:
        """On the restarted worker: the call again, resuming from its confirmed progress, with the
        weights it was started with."""
        wait_alive(self.w.rollout[chunk.worker])
        self.submit(chunk, step, restarted=True)

    def place(self, plan_no: int, samples: list[SampleRef], inter_step: bool) -> list[list[int]]:
        """Which samples (positions in `samples`) each rollout worker runs: the job's scheduling
        policy's plan (by the prompts' length history), its shared queue dealt round-robin. With
        migration the run's one scheduler plans (it places the outliers deferred to this round)."""
        n = len(self.w.rollout)
        if n == 1:
            return [list(range(len(samples)))]
        spec = self.job.spec
        at = {s: i for i, s in enumerate(samples)}
        if self.sched is None:
            sched = make_scheduler(spec.scheduling, n, seed=spec.rollout.seed, max_off_policy=0,
                                   final_step=plan_no, history=self.lengths, learns_lengths=False)
            ids, ref = at, dict(enumerate(samples))
        else:
            sched = self.sched
            sched.final_step = None if inter_step else plan_no
            for s in samples:
                if s not in self.deferred:
                    self.sid[s] = sid = next(self.sids)
                    self.ref[sid] = s
            ids, ref = self.sid, self.ref
        plan = sched.plan_step(plan_no, [Sample(ids[s], s.prompt_id, len(self.encoded[s.prompt_id]))
                                         for s in samples if s not in self.deferred])
        queues = [[at[ref[sid]] for sid in q] for q in plan.queues]
        for j, sid in enumerate(plan.shared):
            queues[j % n].append(at[ref[sid]])
        return queues

    # ------------------------------------------------------------------ history
    def record(self, state: LoopState, layout: StepLayout, chunks: list[Any]) -> None:
        ref = self.w.history.record.remote(state, layout, *chunks)
        self.pending_records.append((state.step, ref))

    def check_records(self) -> None:
        """Note steps whose history could not be recorded (their prompts draft nothing next epoch)."""
        still = []
        for step, ref in self.pending_records:
            if not ray.wait([ref], timeout=0)[0]:
                still.append((step, ref))
            elif (failure := _failure(ref)) is not None:
                self.run.note(f"step {step}: the history worker could not record the step ({failure[0]})")
        self.pending_records = still


def wait_alive(actor: Any, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until a (restarting) worker answers; raise WorkerLost after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(actor.ping.remote(), timeout=max(1.0, deadline - time.monotonic()))
            return
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise WorkerLost(f"a worker did not come back within {timeout_s:.0f}s") from None
            time.sleep(0.2)


def _failure(ref: Any) -> tuple[str, bool] | None:
    """Why the (small) object behind a finished `ref` is an error and whether its worker died for good
    (it will not be restarted), or None if it holds a value."""
    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.GetTimeoutError:
        return None
    except ray.exceptions.RayError as exc:
        return why(exc), isinstance(exc, ray.exceptions.ActorDiedError)
    return None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def why(exc: BaseException) -> str:
    """One line on what went wrong in a worker: the error it raised, not Ray's wrapping of it."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    lines = [ln.strip() for ln in _ANSI.sub("", str(exc)).splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", ln)]
    return (errors[-1] if errors else lines[0] if lines else type(exc).__name__)[:300]


def next_take(job: RLJob, n_prompts: int, state: LoopState) -> tuple[int, list[int]] | None:
    """The epoch and prompt positions of the next step's first round, or None after the last step."""
    algo, data = job.spec.algorithm, job.spec.data
    epoch, cursor = state.epoch, state.cursor
    if epoch > algo.epochs:
        return None
    order = epoch_order(n_prompts, data.seed, epoch, data.shuffle)
    return epoch, order[cursor: cursor + algo.prompts_per_step]


def run_steps_local_ray(job: RLJob, run: RunDir, resume: bool) -> Iterator[StepMetrics]:
    """The job's steps on a private Ray instance on this machine, the workers computing with as
    many threads as this process (so their arithmetic, and the tokens, are the in-process run's)."""
    with local_ray(job.metadata.name):
        yield from run_steps_ray(job, run, resume, torch.get_num_threads(), shared_run_dir=True)


def run_steps_ray(job: RLJob, run: RunDir, resume: bool, threads: int,
                  shared_run_dir: bool = False) -> Iterator[StepMetrics]:
    """The job's steps on Ray workers (cluster.local_ray or a joined cluster must be up).
    shared_run_dir: the train worker writes dumps and checkpoints into `run` (one machine);
    otherwise into the run folder on its own pod's data volume."""
    w = Workers.start(job, str(run.path) if shared_run_dir else None, threads)
    try:
        yield from _steps(job, run, resume, w)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, UserError):  # a worker met the user's mistake: their one-line message
            raise exc.cause from None
        raise
    finally:
        w.stop()


def _later_step(job: RLJob, n_prompts: int, epoch: int, cursor_after: int) -> bool:
    """Whether a step follows the one whose prompts end at position `cursor_after` of `epoch`."""
    return cursor_after < n_prompts or epoch < job.spec.algorithm.epochs


def _steps(job: RLJob, run: RunDir, resume: bool, w: Workers) -> Iterator[StepMetrics]:
    state, again = ray.get(w.train.restore.remote(), timeout=START_TIMEOUT_S) if resume else (LoopState(), [])
    if resume:
        run.cut_back(state.step)  # the controller's own records, where they are not the train worker's
    w.start_history(job)
    w.ready(run)
    ctl = Controller(job, run, w, first_plan=state.step)
    for pid, lengths in ray.get(w.train.lengths.remote()):
        ctl.lengths.observe(pid, lengths)
    ctl.publish(state.policy_version, w.train.weights.remote())
    with GracefulStop() as stop:
        yield from _loop(job, run, w, ctl, state, again, stop)


def _loop(job: RLJob, run: RunDir, w: Workers, ctl: Controller, state: LoopState, again: list[GroupKey],
          stop: GracefulStop) -> Iterator[StepMetrics]:
    spec, algo = job.spec, job.spec.algorithm
    assert algo.dynamic_sampling is not None
    dynamic = algo.dynamic_sampling
    n_prompts = len(ctl.prompts)
    pipelined = algo.max_off_policy_steps >= 1
    pending: Round | None = None
    while state.epoch <= algo.epochs:
        t_step = time.perf_counter()
        order = epoch_order(n_prompts, spec.data.seed, state.epoch, spec.data.shuffle)
        faults.point("rollout", state.step + 1)
        rounds: list[Round] = []
        groups: list[tuple[GroupKey, GroupSummary]] = []
        kept: list[GroupKey] = []
        waited = 0.0
        while state.cursor < len(order) and len(kept) < algo.prompts_per_step and (
                not rounds or (dynamic.enabled and len(rounds) < dynamic.max_gen_batches)):
            take = [ctl.prompts[i] for i in order[state.cursor: state.cursor + algo.prompts_per_step - len(kept)]]
            state.cursor += len(take)
            if pending is not None and (pending.order != [p.prompt_id for p in take] or pending.epoch != state.epoch):
                raise RuntimeError(f"step {state.step + 1}: the round started ahead has prompts {pending.order} of "
                                   f"epoch {pending.epoch}, the step wants {[p.prompt_id for p in take]}")
            rnd = pending or ctl.launch(take, state.epoch, state.step + 1, again=again, inter_step=pipelined and
                                        _later_step(job, n_prompts, state.epoch, state.cursor))
            pending, again = None, []
            t0 = time.perf_counter()
            got = ctl.collect(rnd)
            waited += time.perf_counter() - t0
            rounds.append(rnd)
            groups += got
            kept += [key for key, g in got if not dynamic.enabled or g.informative]

        faults.point("train", state.step + 1)
        layout = StepLayout([key for key, _ in groups])
        chunks, version_used = ctl.take_groups(layout.groups)
        before = state.policy_version
        state.step += 1
        state.policy_version += 1 if kept else 0
        record_state = replace(state)  # the epoch the step's samples belong to, before any rollover
        t_train = time.perf_counter()
        stats_ref, weights_ref = w.train.step.options(num_returns=2).remote(record_state, layout, kept, *chunks)
        ctl.record(record_state, layout, chunks)
        if state.cursor >= len(order):
            state.epoch, state.cursor = state.epoch + 1, 0
        if pipelined and (nxt := next_take(job, n_prompts, state)) is not None:
            pending = ctl.launch([ctl.prompts[i] for i in nxt[1]], nxt[0], state.step + 1,
                                 inter_step=_later_step(job, n_prompts, nxt[0], state.cursor + len(nxt[1])))
        stats: dict[str, float] = ray.get(stats_ref)
        train_wait = time.perf_counter() - t_train
        if kept:
            ctl.publish(state.policy_version, weights_ref)
        for r in w.rollout:
            r.end_step.remote()
        ctl.check_records()

        clock = {"rollout": sum(max(c.rollout_seconds for c in r.summaries) for r in rounds),
                 "reward": sum(max(c.reward_seconds for c in r.summaries) for r in rounds),
                 "train": stats.pop("time_train_s")}
        reports = [r.report(len(w.rollout)) for r in rounds] if len(w.rollout) > 1 else []
        history = [r.history_ok for r in rounds if r.history_ok is not None]
        engine_stats = {k: stats.pop(k) for k in ("rollout_logprob_diff_mean", "rollout_logprob_diff_max")
                        if k in stats}
        metrics = step_metrics(
            [g for _, g in groups], len(rounds), clock, reports, record_state, stats, **engine_stats,
            time_step_s=round(time.perf_counter() - t_step, 3),
            time_wait_rollout_s=round(waited, 3), time_wait_train_s=round(train_wait, 3),
            policy_lag_max=before - version_used, history_ok=all(history) if history else None,
            worker_reruns=ctl.reruns, rollout_deferred=sum(r.deferred for r in rounds),
            rollout_resumed_tokens=sum(c.resumed_tokens for r in rounds for c in r.summaries))
        ctl.reruns = 0
        run.append_metrics(metrics.row())
        check_failures([e for _, g in groups for e in g.reward_errors], spec.reward, state.step,
                       dumps.dump_path(run.path, state.step))
        faults.point("metrics", state.step)
        ahead = {(pending.epoch, pid) for pid in pending.order} if pending is not None else set()
        saved = state.step % spec.checkpoint.every_steps == 0 or state.epoch > algo.epochs
        if saved:
            ray.get(w.train.save.remote(replace(state), [key for key in ctl.open if key not in ahead]))
        yield metrics
        if stop.requested and state.epoch <= algo.epochs:
            if not saved:
                ray.get(w.train.save.remote(replace(state), [key for key in ctl.open if key not in ahead]))
            stop.check(state.step)
