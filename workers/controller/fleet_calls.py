"""Starting rollout calls: a call of samples on a worker (loading the weights its samples began
with, resuming each from its tokens so far), samples admitted into a running call, and a call run
again from the start when the tokens it needed died with a worker."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

from rhymerl.api import RLJob
from rhymerl.workers.controller.fleet_records import (
    ADMIT_WAIT_S,
    SNAPSHOT_PASSES,
    STATE_PASSES,
    Book,
    Call,
    Calls,
    Member,
    Progress,
    Round,
)
from rhymerl.workers.controller.fleet_weights import FleetWeights
from rhymerl.workers.controller.role_apis import RolloutAPI
from rhymerl.workers.controller.transport import Indexes, Result, ResultLost, Transport, WorkerGone
from rhymerl.workers.roles.rollout_engine import engine_abilities
from rhymerl.workers.roles.samples import RolloutCall, RolloutProgress, SampleRef
from rhymerl.workers.rollout.generation import GenRequest
from rhymerl.workers.rollout.sampling import sample_key


class CallStarter:
    """Opens the fleet's calls and admits samples into running ones."""

    def __init__(self, job: RLJob, transport: Transport, book: Book, calls: Calls, weights: FleetWeights,
                 encoded: Mapping[str, list[int]], fleet_size: Callable[[], int]) -> None:
        self.job, self.transport, self.book, self.calls, self.weights = job, transport, book, calls, weights
        self.encoded, self.fleet_size = encoded, fleet_size
        self.ids = itertools.count()
        spec = job.spec
        self.abilities = engine_abilities(spec)
        self.releasable = self.abilities.releases and self.abilities.admits
        """Samples move between running calls: handed back by one (`release`) and taken by another
        (`admit`). A vLLM call hands back on a leave or a notice, but takes no moved sample, so the
        scheduler's moves stay off it."""
        speculation = spec.rollout.speculation
        self.relays_groups = speculation.group_drafts and speculation.group_relay and speculation.reads_history \
            and self.abilities.relays_groups
        """Calls report their samples' new tokens, relayed to the calls running their siblings
        elsewhere (group drafts across workers; a vLLM call's groups are its own)."""
        self.drafts_remotely = speculation.freed_drafters and self.abilities.remote_drafts
        """Freed workers draft for straggling ones (fleet_drafters.py), found from their calls' reports."""

    def open(self, m: Member, rnd: Round, samples: list[SampleRef], indexes: Result[Indexes] | None, version: int,
             resume_of: Mapping[SampleRef, Progress | None], resumed: Mapping[SampleRef, int]) -> Call:
        requests = [self._request_of(s) for s in samples]
        call = Call(next(self.ids), m, rnd, samples, requests, indexes, version)
        for s in samples:
            self.book.hold(call.id, s, resume_of.get(s), resumed.get(s, 0))
        self._submit(call)
        rnd.calls.append(call)
        rnd.workers.add(m.id)
        return call

    def _request_of(self, s: SampleRef) -> GenRequest:
        if (p := self.book.parked(s)) is not None:
            return p.request
        return GenRequest(self.encoded[s.prompt_id], sample_key(s.prompt_id, s.epoch, s.index), s.prompt_id)

    def _submit(self, call: Call) -> None:
        """Start the call with the weights its samples began with (the worker loads them first)."""
        m = call.member
        self.weights.load(m, call.version)
        concurrent = self.transport.concurrent
        watched = self.job.spec.rollout.max_replicas > 1 or self.fleet_size() > 1
        rc = RolloutCall(call.id, list(call.samples), list(call.requests), call.round.step,
                         report_every=(STATE_PASSES if concurrent else 1)
                         if watched and (self.releasable or self.drafts_remotely) else None,
                         snapshot_every=SNAPSHOT_PASSES if concurrent and self.abilities.snapshots else None,
                         share_every=STATE_PASSES if watched and self.relays_groups else None)
        held = self.book.held(call.id)
        self.book.report(call.id, {s: held[s].resumed for s in call.samples})
        resume = {s: held[s].resume for s in call.samples}
        call.stream = self.transport.stream(m.handle, call.id, rc, call.indexes, self.progress(resume))
        self.calls.add(call)

    def progress(self, resume: Mapping[SampleRef, Progress | None]) -> Progress | None:
        """One object of these samples' tokens so far, each from the source it resumes from (None:
        all afresh). A single source goes as it is (a worker takes the samples it names)."""
        sources = {id(r): r for r in resume.values() if r is not None}
        if len(sources) <= 1:
            return next(iter(sources.values()), None)
        got = {k: (r if isinstance(r, RolloutProgress) else self.transport.get(r)).results for k, r in sources.items()}
        return RolloutProgress({s: got[id(r)][s] for s, r in resume.items() if r is not None and s in got[id(r)]})

    def admit(self, call: Call, samples: list[SampleRef], resume: dict[SampleRef, Progress | None],
              tokens: dict[SampleRef, int]) -> bool:
        """Parked samples into `call`, running on its worker; False if the worker did not take them."""
        requests = [p.request for s in samples if (p := self.book.parked(s)) is not None]
        try:
            ok = self.transport.get(self.transport.call(call.member.handle, RolloutAPI.admit, call.id, samples, requests,
                                                        self.transport.arg(self.progress(resume))),
                                    timeout=ADMIT_WAIT_S)
        except (WorkerGone, TimeoutError, ResultLost):
            return False
        if ok:
            call.samples += samples
            call.requests += requests
            for s in samples:
                self.book.hold(call.id, s, resume[s], tokens[s], tokens=tokens[s])
        return bool(ok)

    def drop(self, call: Call) -> None:
        """A call whose tokens (what it resumed from, or its output) died with a worker: gone from its round."""
        call.ended, call.output = True, None
        self.calls.drop(call)
        self.book.close(call.id)
        if call in call.round.calls:
            call.round.calls.remove(call)

    def again(self, call: Call, member: Member) -> Call:
        """A dropped call run again from the start on `member` (position-keyed sampling: the same tokens)."""
        again = Call(next(self.ids), member, call.round, call.samples, call.requests, call.indexes, call.version)
        for s in call.samples:
            self.book.hold(again.id, s, None, 0)
        call.round.calls.append(again)
        self._submit(again)
        return again
