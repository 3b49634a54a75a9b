"""Samples in a rollout fleet's hands find a place: those a worker handed back (a move asked of its
call, or its worker leaving) and those whose worker died are parked, then go where the move says or
where the scheduler spreads them, into the call running there if it can take them, else a new call,
each resuming from its tokens so far."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from rhymerl.algorithms.scheduling.executor import Executor
from rhymerl.algorithms.scheduling.types import Move
from rhymerl.workers.controller.fleet_calls import CallStarter
from rhymerl.workers.controller.fleet_members import Membership
from rhymerl.workers.controller.fleet_records import (
    RERUNS,
    Book,
    Call,
    Calls,
    Member,
    Parked,
    Round,
    WorkerLost,
    by,
)
from rhymerl.workers.controller.transport import Result, Transport
from rhymerl.workers.roles.samples import Handback, RolloutProgress, SampleRef


class Placement:
    """Parks samples that lost their place and places parked ones."""

    def __init__(self, transport: Transport, book: Book, calls: Calls, members: Membership, starter: CallStarter,
                 executor: Executor, live_round: Callable[[], Round | None], note: Callable[[str], None]) -> None:
        self.transport, self.book, self.calls, self.members, self.starter = transport, book, calls, members, starter
        self.executor, self.live_round, self.note = executor, live_round, note

    def handback(self, call: Call, item: Result[RolloutProgress], hb: Handback) -> None:
        """Samples a call handed back: each goes where the move asked for it says; with the worker
        leaving, the others are parked and the scheduler spreads them over the workers that stay."""
        rnd, m = call.round, call.member
        if hb.leaving:
            m.leaving = True
            item = self.transport.keep(item)  # its worker goes: the tokens must not go with it
        for s in hb.missed:
            if (move := self.book.answer(s)) is not None:
                self.executor.refused(move.sid)
        requests = dict(zip(call.samples, call.requests, strict=True))
        keep = [i for i, s in enumerate(call.samples) if s not in hb.handed]
        call.samples, call.requests = [call.samples[i] for i in keep], [call.requests[i] for i in keep]
        self.book.release(call.id, hb.handed)
        by_dst: dict[int | None, list[SampleRef]] = defaultdict(list)
        orphans = []
        for s in hb.handed:
            move = self.book.answer(s)
            if move is None:
                orphans.append(s)
            else:
                by_dst[move.dst].append(s)
        for dst, moved in by_dst.items():
            for s in moved:
                self.book.park(s, Parked(requests[s], item, hb.handed[s], call.version, call.indexes,
                                         rnd if dst is not None else None, m.slot), deferred=dst is None)
            if dst is not None:
                self.place(moved, self.members.at(dst), src=m)
            for s in moved:
                sid = self._sid(s)
                reason = self.executor.in_flight[sid].reason
                rnd.counts["deferred" if dst is None else "stolen" if reason == "steal" else "migrated"] += 1
                self.executor.confirmed(Move(sid=sid, src=m.slot, dst=dst, generated=hb.handed[s]))
        if orphans:
            for s in orphans:
                self.book.park(s, Parked(requests[s], item, hb.handed[s], call.version, call.indexes, rnd, m.slot),
                               deferred=False)
            rnd.counts["handed_back"] += len(orphans)
            self.unpark(rnd)

    def lost(self, call: Call, why: str) -> None:
        """The worker of `call` died: every call of it that had not ended is resumed elsewhere from
        the tokens its samples had at their last snapshot."""
        m = call.member
        self.members.remove(m)
        self.transport.stop(m.handle)
        for c in [c for c in self.calls.running() if c.member is m]:
            c.ended = True
            self.calls.reruns += 1
            rnd = c.round
            held = self.book.held(c.id)
            for s, request in zip(c.samples, c.requests, strict=True):
                if (move := self.book.answer(s)) is not None:
                    self.executor.refused(move.sid)
                if (losses := self.book.lose(s)) > RERUNS:
                    raise WorkerLost(f"step {rnd.step}: sample {s.index} of prompt {s.prompt_id} lost its rollout "
                                     f"worker {losses} times (last: {why})")
                self.book.park(s, Parked(request, held[s].resume, held[s].resumed, c.version, c.indexes, rnd, m.slot),
                               deferred=False)
            self.note(f"step {rnd.step}: rollout worker {m.id} died ({why or 'no notice'}); its {len(c.samples)} "
                      f"samples go on elsewhere from the tokens they had (policy version {c.version})")
            rnd.counts["handed_back"] += len(c.samples)
            self.unpark(rnd)

    def restart(self, call: Call) -> None:
        """Objects a call needed (the tokens it resumes from) or made (its output) died with the
        worker that held them: it runs again from the start, on the least busy worker
        (position-keyed sampling: the same tokens)."""
        self.starter.drop(call)
        live = self.members.staying()
        member = call.member if call.member in live or not live else self.members.least_busy(live)[0]
        self.note(f"step {call.round.step}: the tokens {len(call.samples)} samples had were lost with their "
                  "worker; they are generated again from the start")
        self.starter.again(call, member)

    def unpark(self, rnd: Round) -> None:
        """Samples of this round in the fleet's hands (their worker left or died) find a place: the
        scheduler spreads those it still counts as unfinished over the workers that stay; the others
        (it heard them finish, but their results died with their worker) go to the least busy one.
        With no worker to take them they wait for one to join."""
        left = [s for s, p in self.book.parked_items() if p.round is rnd]
        live = [m for m in self.members.staying() if m.slot >= 0]
        if not left or not live:
            return
        booked = [s for s in left if self.book.sid(s) is not None and not self.book.told(s)]
        for part in by(booked, lambda s: self._parked(s).slot):
            self.executor.evacuate(self._parked(part[0]).slot, rnd.no,
                                   [(self._sid(s), self._parked(s).tokens) for s in part], [m.slot for m in live])
        rest = [s for s in left if self.book.parked(s) is not None and s not in booked]
        if rest:
            self.place(rest, self.members.least_busy(live)[0], src=None)

    def place(self, samples: list[SampleRef], dst: Member, src: Member | None) -> None:
        """Parked samples onto `dst`: into the call it is running if that call can take them (same
        round, same weights), else a new call there, resuming from their tokens."""
        def key(s: SampleRef) -> tuple[int, int, int]:
            p = self._parked(s)
            return p.version, id(p.indexes), id(p.round)

        for part in by(samples, key):
            p0 = self._parked(part[0])
            rnd = p0.round or self.live_round()
            assert rnd is not None
            running = [c for c in self.calls.active(dst) if c.round is rnd and c.version == p0.version]
            if src is not None and not self.calls.active(dst):
                self.transport.catch_up(dst.handle, src.handle)  # an idle worker cannot start it earlier
            resume = {s: self._parked(s).resume for s in part}
            tokens = {s: self._parked(s).tokens for s in part}
            if not (running and self.starter.releasable and self.starter.admit(running[0], part, resume, tokens)):
                self.starter.open(dst, rnd, part, p0.indexes, p0.version, resume, tokens)
            for s in part:
                self.book.unpark(s)

    def _parked(self, s: SampleRef) -> Parked:
        p = self.book.parked(s)
        assert p is not None, f"{s} is not parked"
        return p

    def _sid(self, s: SampleRef) -> int:
        sid = self.book.sid(s)
        assert sid is not None, f"{s} has no scheduler id"
        return sid
