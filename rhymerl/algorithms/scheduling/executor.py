"""Carrying out a scheduler's decisions, once for every fleet of rollout workers: the simulator's
(rhymerl.tools.sim), the in-process workers of `rhymerl run` and the Ray workers of a cluster
(workers/controller/fleet.py drives both of those).

A scheduler answers events with actions (types.py): watch a sample until it has generated some
tokens, move a sample (intra-step to another worker, or inter-step to the next step), rebalance
`count` samples from one worker to another. An idle worker may take over unfinished samples of its
step from the others (work stealing, `steal`), and the samples of a worker that leaves the fleet go
to the others (`evacuate`). What each of these means is decided here; how a worker holds, runs and
hands over a sample is the `Fleet`'s business.

Every move is a request: the fleet answers it at once (the simulator) or later (a worker reached
over the network hands the sample back at its next pass), with `confirmed` (the move as it was
done: the tokens it carried) or `refused` (the sample finished first, or its worker broke off).
A move the scheduler decided (`Move`) is booked when it decides it and undone if refused
(`on_move_failed`); the others are booked when confirmed (`on_moved`). While a sample is in flight
nothing else may move it, and its watch reports wait.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .base import Scheduler
from .types import Action, Move, MoveReason, Rebalance, SampleId, Watch


class Fleet(Protocol):
    """The workers an executor drives, as the fleet knows them now."""

    def watch(self, sid: SampleId, tokens: int) -> None:
        """Report sample `sid` (Executor.progressed) once it has generated `tokens` tokens."""

    def request(self, move: Move) -> None:
        """Take `move.sid` off `move.src` with its tokens, to `move.dst` (None: the next step); answer,
        now or later, with Executor.confirmed or Executor.refused."""

    def unfinished(self, worker: int, round_no: int) -> Sequence[tuple[SampleId, int]]:
        """The samples of `step` on `worker` that have not finished, with the tokens each has
        generated: waiting ones in queue order, then running ones."""


@dataclass(frozen=True)
class _InFlight:
    move: Move
    reason: MoveReason


class Executor:
    """Carries out one scheduler's actions on one fleet."""

    def __init__(self, scheduler: Scheduler, fleet: Fleet) -> None:
        self.sched = scheduler
        self.fleet = fleet
        self.in_flight: dict[SampleId, _InFlight] = {}
        self.done: Counter[MoveReason] = Counter()
        """Moves confirmed, by reason (the fleet reads and resets it per round)."""
        self.tokens_moved = 0
        """Generated tokens the confirmed moves carried."""

    # ------------------------------------------------------------------ actions
    def carry_out(self, actions: Sequence[Action]) -> None:
        """Do what the scheduler asked, in order."""
        for a in actions:
            if isinstance(a, Watch):
                self.fleet.watch(a.sid, a.tokens)
            elif isinstance(a, Move):
                self._request(a, "migrate")
            elif isinstance(a, Rebalance):
                for sid, generated in rebalance_choice(self._offered(a.src, a.round_no), a.count):
                    self._request(Move(sid=sid, src=a.src, dst=a.dst, generated=generated, recompute=False),
                                  "rebalance")

    def steal(self, idle: int, round_no: int) -> int:
        """Idle worker `idle` offers to take over unfinished samples of `step` from the others; the
        scheduler picks (on_idle). Returns how many moves were requested."""
        offered = {v: samples for v in range(self.sched.workers) if v != idle
                   if (samples := self._offered(v, round_no))}
        if not offered:
            return 0
        moves = self.sched.on_idle(idle, round_no, offered)
        for m in moves:
            self._request(m, "steal")
        return len(moves)

    def evacuate(self, worker: int, round_no: int, samples: Sequence[tuple[SampleId, int]], live: Sequence[int]) -> int:
        """`worker` left the fleet holding these unfinished samples of `step` (with the tokens they
        keep); the scheduler spreads them over `live` workers. Returns how many moves were requested
        (none without a live worker: the fleet keeps them until one joins)."""
        moves = self.sched.on_leave(worker, round_no, [s for s in samples if s[0] not in self.in_flight], live)
        for m in moves:
            self._request(m, "leave")
        return len(moves)

    def consolidate(self, moves: Sequence[Move]) -> None:
        """Moves the fleet decided itself, to empty a worker so that it drafts for the others
        (scheduling/freed_drafters.py): booked as rebalances once confirmed."""
        for m in moves:
            self._request(m, "rebalance")

    def _offered(self, worker: int, round_no: int) -> list[tuple[SampleId, int]]:
        return [s for s in self.fleet.unfinished(worker, round_no) if s[0] not in self.in_flight]

    def _request(self, move: Move, reason: MoveReason) -> None:
        if move.sid in self.in_flight:  # already on its way elsewhere: this one cannot happen
            if reason == "migrate":
                self.sched.on_move_failed(move)
            return
        self.in_flight[move.sid] = _InFlight(move, reason)
        self.fleet.request(move)

    # ------------------------------------------------------------------ answers from the fleet
    def confirmed(self, move: Move) -> None:
        """The fleet moved `move.sid` as asked; `move` says with how many tokens (and whether its KV
        cache is recomputed where it goes)."""
        asked = self.in_flight.pop(move.sid)
        if asked.reason != "migrate":
            self.sched.on_moved([move], asked.reason)
        self.done[asked.reason] += 1
        self.tokens_moved += move.generated

    def refused(self, sid: SampleId) -> None:
        """The fleet could not move `sid` (it finished first, or its worker broke off): the books
        return to before the request."""
        asked = self.in_flight.pop(sid)
        if asked.reason == "migrate":
            self.sched.on_move_failed(asked.move)

    # ------------------------------------------------------------------ events for the scheduler
    def finished(self, sid: SampleId, worker: int, output_len: int, now: float) -> None:
        """Sample `sid` finished on `worker` (a move still in flight for it is refused first)."""
        if sid in self.in_flight:
            self.refused(sid)
        self.carry_out(self.sched.on_sample_finished(sid, worker, output_len, now))

    def progressed(self, sid: SampleId, worker: int, generated: int, now: float) -> None:
        """A watched sample reached its token count (ignored while it is in flight)."""
        if sid not in self.in_flight:
            self.carry_out(self.sched.on_progress(sid, worker, generated, now))


def rebalance_choice(unfinished: Sequence[tuple[SampleId, int]], count: int) -> list[tuple[SampleId, int]]:
    """The `count` samples cheapest to move: waiting ones (no tokens) first, the last queued first
    (they would start last), then those with the fewest generated tokens (ties: lower id)."""
    fresh = [s for s in unfinished if s[1] == 0][::-1]
    started = sorted((s for s in unfinished if s[1] > 0), key=lambda s: (s[1], s[0]))
    return (fresh + started)[:count]
