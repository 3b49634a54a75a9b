"""Rollout calls on the torch engine (rollout/engine.py), this worker's own copy of the weights.

Its sampling is keyed by position, so a sample's tokens do not depend on where they were made: a
call hands samples back mid-call and takes moved ones in with their tokens, snapshots what a re-run
resumes from, verifies drafts from a freed drafter and relays its group drafts (rollout_engine.TORCH).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping
from typing import ClassVar

import torch

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.drafting.cap_decisions import CapDecisions
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api import RLJob
from rhymerl.workers import faults
from rhymerl.workers.history.store import MemoryHistoryStore
from rhymerl.workers.model.registry import load_native_policy
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.roles.busy_clock import BusyClock
from rhymerl.workers.roles.call_mailbox import CallMailbox, Mail
from rhymerl.workers.roles.rollout_engine import (
    TORCH,
    CallEnd,
    EngineAbilities,
    Report,
    Weights,
    handed_back,
    is_finished,
)
from rhymerl.workers.roles.samples import (
    CallState,
    ProgressTag,
    RolloutCall,
    RolloutProgress,
    SampleRef,
    StateTag,
)
from rhymerl.workers.roles.threads import chooser
from rhymerl.workers.roles.worker_metrics import WorkerMetrics
from rhymerl.workers.rollout.engine import EngineSession, TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams
from rhymerl.workers.rollout.group_drafts import GroupDrafts, GrownTokens
from rhymerl.workers.rollout.remote_drafts import RemoteDrafts
from rhymerl.workers.rollout.speculation import RolloutSpeculation, reachable_batches
from rhymerl.workers.rollout.verify_cost import Progress, load_or_measure


class TorchRollout:
    """The torch engine behind a rollout worker: every ability (hand back, admit, snapshots, remote drafts, group relay)."""

    abilities: ClassVar[EngineAbilities] = TORCH

    def __init__(self, job: RLJob, stop_ids: list[int], params: SamplingParams, threads: int,
                 progress: Progress | None, clock: Callable[[], float], metrics: WorkerMetrics) -> None:
        """threads: the worker's torch threads; `clock`: the worker's busy seconds, the draft cap prices
        passes from them."""
        spec = job.spec
        self.job, self.stop_ids, self.params, self.metrics = job, stop_ids, params, metrics
        self.model, _ = load_native_policy(spec.model)
        adaptive = chooser(threads) if spec.rollout.adaptive_threads and threads > 1 else None
        self.engine = TorchEngine(self.model, stop_ids, spec.rollout.max_batch_size, threads=adaptive)
        self.speculation = RolloutSpeculation.for_job(job, self.model, MemoryHistoryStore(), progress)
        # the profile is this count's (its cache key): passes at another correct only the calibration
        self.speculation.control.profiled = lambda: torch.get_num_threads() == threads
        self.speculation.control.clock = clock

    def run(self, call: RolloutCall, indexes: Mapping[str, HistoryIndex] | None, resume: RolloutProgress | None,
            mailbox: CallMailbox, busy: BusyClock) -> Generator[Report, None, CallEnd]:
        c = self._open(call, indexes, resume)
        mailbox.open(call.id, c.session.max_prompt_len)
        try:
            passes = 0
            while True:
                mail = mailbox.collect()
                release = self._take(c, mail)
                if release:
                    yield from c.hand_back(release, mail.leaving, busy)
                if not c.session.busy:
                    if mailbox.close_unless_admitted():
                        break
                    continue
                c.results.update(c.session.step())
                passes += 1
                yield from c.report(passes, busy)
        finally:
            mailbox.close()
            if c.remote is not None:
                c.remote.attach(None)  # the drafter frees what it held for this call
        return c.end()

    def _open(self, call: RolloutCall, indexes: Mapping[str, HistoryIndex] | None,
              resume: RolloutProgress | None) -> _TorchCall:
        spec = self.job.spec.rollout.speculation
        groups = GroupDrafts(spec, (r.prompt_id for r in call.requests)) if spec.group_drafts else None
        drafts = self.speculation.drafts_from(indexes or {}, groups)
        remote = RemoteDrafts(spec, drafts) if spec.freed_drafters else None
        # samples other calls hand over (`admit`) take the slots this call's finished samples free
        session = self.engine.session(self.params, remote or drafts, slots=len(call.requests),
                                      max_prompt_len=max(len(r.prompt_ids) for r in call.requests))
        c = _TorchCall(call, session, groups, remote, self._finished)
        for i, sample in enumerate(c.samples):
            c.add(i, resume.results.get(sample) if resume else None)
        return c

    def _take(self, c: _TorchCall, mail: Mail) -> set[SampleRef]:
        """Apply what the call heard; the samples to hand back (leaving: every unfinished one)."""
        if c.remote is not None and mail.link:
            c.remote.attach(mail.link[0])
        if c.groups is not None and mail.heard:
            before = c.groups.heard
            c.groups.hear(mail.heard)
            self.metrics.heard.inc(c.groups.heard - before)
        for sample, request, partial in mail.admitted:
            c.join(sample, request, partial)
        if mail.leaving:
            return {c.samples[i] for i in c.live()}
        return mail.release

    def _finished(self, r: GenResult) -> bool:
        return is_finished(r, self.stop_ids, self.params.max_response_length)

    def load_weights(self, weights: Weights) -> None:
        with torch.no_grad():
            self.model.load_hf_state_dict(weights)

    def drafter(self) -> TinyLlama | None:
        return self.speculation.draft

    def cost_profile(self) -> CostProfile | None:
        """The verify-cost profile speculation prices drafts with (measured now, or read from this
        machine's cache, where speculation does not use one)."""
        return self.speculation.control.profile or load_or_measure(self.model, batches=reachable_batches(self.job))

    def cap_decisions(self) -> CapDecisions:
        """The draft caps the controller chose since last asked: the passes of the call that just ended."""
        return self.speculation.control.take_decisions()

    def end_step(self) -> None:
        """What the step's passes showed about the verify-cost profile goes into the machine's cache."""
        self.speculation.keep_cost_evidence()

    def close(self) -> None:
        pass


class _TorchCall:
    """One call's books: its samples by key in the session (moved ones appended), what finished,
    what was handed back, the tokens each brought and the tokens its reports shared."""

    def __init__(self, call: RolloutCall, session: EngineSession, groups: GroupDrafts | None,
                 remote: RemoteDrafts | None, finished: Callable[[GenResult], bool]) -> None:
        self.call, self.session, self.groups, self.remote = call, session, groups, remote
        self._finished = finished
        self.samples, self.requests = list(call.samples), list(call.requests)
        self.results: dict[int, GenResult] = {}
        self.gone: set[int] = set()  # handed back
        self.carried: dict[int, int] = {}  # tokens each sample brought from elsewhere
        self.shared: dict[int, int] = {}  # tokens of each sample its reports carried (share_every)

    def add(self, i: int, partial: GenResult | None, first: bool = False) -> None:
        self.carried[i] = len(partial.response_ids) if partial else 0
        if partial is not None and self._finished(partial):
            self.results[i] = partial
        else:
            self.session.add(i, self.requests[i], partial, first=first)

    def join(self, sample: SampleRef, request: GenRequest, partial: GenResult | None) -> None:
        """An admitted sample, at the head of the queue."""
        if self.groups is not None:
            self.groups.prompts.add(request.prompt_id)
        self.samples.append(sample)
        self.requests.append(request)
        self.add(len(self.samples) - 1, partial, first=True)

    def live(self) -> set[int]:
        return {*self.session.waiting(), *self.session.running()}

    def hand_back(self, release: set[SampleRef], leaving: bool, busy: BusyClock) -> Iterator[Report]:
        taken = {i: self.session.take(i) for i in sorted(self.live()) if self.samples[i] in release}
        self.gone.update(taken)
        yield from handed_back(busy, {self.samples[i]: r for i, r in taken.items()}, release, leaving)

    def report(self, passes: int, busy: BusyClock) -> Iterator[Report]:
        """After pass `passes`: a snapshot every `snapshot_every`, else a state every `report_every`."""
        call = self.call
        if call.snapshot_every and passes % call.snapshot_every == 0:
            snapshot = RolloutProgress({self.samples[i]: r for i, r in (self.results | self.session.progress()).items()})
            busy.pause()
            yield snapshot
            yield ProgressTag(self.state(passes))
            busy.resume()
            faults.point("rollout-worker", call.step)
        elif call.report_every and passes % call.report_every == 0:
            busy.pause()
            yield None
            yield StateTag(self.state(passes))
            busy.resume()
            if not call.snapshot_every:  # in the step loop's process: a point to hold at
                faults.point("rollout-worker", call.step)

    def state(self, passes: int | None = None) -> CallState:
        """Waiting samples in queue order, then running ones; passes: after this many (None: the call's end)."""
        live = [*self.session.waiting(), *self.session.running()]
        every = self.call.share_every
        share = every is not None and (passes is None or passes % every == 0)
        return CallState({self.samples[i]: self.session.generated(i) for i in live},
                         {self.samples[i]: len(r.response_ids) for i, r in self.results.items()},
                         self.grown() if share else None)

    def grown(self) -> GrownTokens | None:
        """Tokens since they were last shared (a moved sample's from where it arrived: its tokens
        before that were shared where they were generated)."""
        rows = []
        session, results = self.session, self.results
        for i, n in [*((i, session.generated(i)) for i in session.running()),
                     *((i, len(r.response_ids)) for i, r in results.items())]:
            start = self.shared.get(i, self.carried[i])
            if n > start:
                tokens = results[i].response_ids[start:] if i in results else session.tokens(i, start)
                request = self.requests[i]
                rows.append((self.samples[i].epoch, request.sample_id, request.prompt_id, start, tokens))
                self.shared[i] = n
        return GrownTokens.of(rows)

    def end(self) -> CallEnd:
        kept = [i for i in range(len(self.requests)) if i not in self.gone]
        return CallEnd([self.samples[i] for i in kept], [self.results[i] for i in kept],
                       sum(self.carried[i] for i in kept), self.groups.heard if self.groups else 0, self.state())
