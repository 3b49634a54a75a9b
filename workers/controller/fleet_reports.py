"""Following a rollout fleet's calls: each report (token counts, snapshots, samples handed back, the
output) goes into the round book, finishes and watched counts to the executor, and a call's new
tokens are relayed to the calls running its samples' siblings elsewhere (group drafts across
workers)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from rhymerl.algorithms.scheduling.executor import Executor
from rhymerl.workers import faults
from rhymerl.workers.controller.fleet_places import Placement
from rhymerl.workers.controller.fleet_records import Book, Call, Round
from rhymerl.workers.controller.role_apis import RolloutAPI
from rhymerl.workers.controller.transport import (
    HandbackReport,
    OutputReport,
    ProgressReport,
    Report,
    StateReport,
    Transport,
)
from rhymerl.workers.roles.samples import CallState
from rhymerl.workers.rollout.group_drafts import GrownTokens


class Reports:
    """What the fleet does with each report of a call."""

    def __init__(self, transport: Transport, book: Book, executor: Executor, placement: Placement,
                 score: Callable[[Call], None], relays_groups: bool) -> None:
        """score: an ended call's output goes to a reward worker (as it comes, where roles run beside
        each other)."""
        self.transport, self.book, self.executor, self.placement = transport, book, executor, placement
        self.score, self.relays_groups = score, relays_groups
        self.heard_for: defaultdict[int, list[GrownTokens]] = defaultdict(list)
        """Per running call: its samples' siblings' tokens from other workers, not sent yet (`_relay`)."""
        self.reports_kept = 0  # reports whose tokens `heard_for` keeps

    def on_report(self, call: Call, report: Report) -> None:
        match report:
            case HandbackReport(handback=handback, progress=progress):
                self.placement.handback(call, progress, handback)
            case StateReport(state=state):
                self._observe(call, state)
            case ProgressReport(state=state, progress=progress):
                for s in state.running.keys() | state.finished.keys():
                    self.book.snapshot(call.id, s, progress, state.running.get(s, state.finished.get(s, 0)))
                self._observe(call, state)
                faults.point("snapshot-kept", call.round.step)
            case OutputReport(state=state, output=output):
                call.output, call.ended = output, True
                call.round.ends[call.member.id] = self.transport.clock(call.member.handle)
                self._observe(call, state)
                if self.transport.concurrent:
                    self.score(call)

    def _observe(self, call: Call, state: CallState) -> None:
        """What a call reported: finishes and token counts go to the scheduler (watched samples once
        they reach their count)."""
        if self.relays_groups:
            self._relay(call, state.grown)
        now = self.transport.clock(call.member.handle)
        call.reported = True
        self.book.report(call.id, state.running)
        for s, length in state.finished.items():
            if not self.book.finish(call.id, s, length):
                continue
            self.book.answer(s)  # a move still asked for is refused: it finished first
            if (sid := self.book.tell(s)) is not None:
                self.executor.finished(sid, call.member.slot, length, now)
        for s, generated in state.running.items():
            if self.book.reached(s, generated):
                sid = self.book.sid(s)
                assert sid is not None, "a watched sample has a scheduler id"
                self.executor.progressed(sid, call.member.slot, generated, now)

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
                        (s.epoch, s.prompt_id) for s in other.samples if not self.book.finished(other.id, s)):
                    self.heard_for[other.id].append(grown)
        self.reports_kept += 1
        if self.reports_kept < len(live):
            return
        self.reports_kept = 0
        for other in live:
            blocks = self.heard_for.pop(other.id, None)
            if blocks:
                self.transport.tell(other.member.handle, RolloutAPI.hear, other.id, blocks)

    def end_round(self, rnd: Round) -> None:
        for c in rnd.calls:
            self.heard_for.pop(c.id, None)
        self.reports_kept = 0
