"""Carrying out a scheduler's decisions, once for every executor: the simulator's workers
(rhymerl.tools.sim) and the real engine replicas of `rhymerl run` (workers/controller/rollout_pool.py).

A scheduler answers events with actions (types.py): watch a sample until it has generated some
tokens, move a sample (intra-step to another worker, or inter-step to the next step), rebalance
`count` samples from one worker to another; an idle worker may take unstarted samples of its step
from others (work stealing). What each action means is decided here; how a worker holds, runs and
hands over a sample is the `Fleet`'s business.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .base import Scheduler
from .types import Action, Move, Rebalance, SampleId, Watch


class Fleet(Protocol):
    """The workers an executor drives, as of now (an implementation brings its state up to date)."""

    def watch(self, sid: SampleId, tokens: int) -> None:
        """Report sample `sid` to the scheduler (on_progress) once it has generated `tokens` tokens."""

    def move(self, sid: SampleId, src: int | None, dst: int | None, generated: int | None, recompute: bool) -> Move:
        """Take `sid` off worker `src` (None: wherever it is), with its tokens, to the front of
        `dst`'s queue (None: the next step); `generated`: the token count the scheduler saw, checked.
        Returns the move as done (its tokens; whether its KV cache is recomputed)."""

    def waiting(self, worker: int) -> Sequence[SampleId]:
        """Samples queued on `worker`, in queue order."""

    def running(self, worker: int) -> Sequence[SampleId]:
        """Samples `worker` is decoding."""

    def generated(self, sid: SampleId) -> int:
        """Tokens sample `sid` has generated so far."""

    def unstarted(self, worker: int, step: int) -> Sequence[SampleId]:
        """Samples of `step` planned on or queued at `worker` that have not generated a token."""

    def hand_over(self, move: Move) -> None:
        """Give the unstarted sample `move.sid` from `move.src` to idle `move.dst`, at its queue's end."""


def carry_out(scheduler: Scheduler, fleet: Fleet, actions: Sequence[Action]) -> None:
    """Do what the scheduler asked, in order; rebalanced moves are reported back (on_moved)."""
    for a in actions:
        if isinstance(a, Watch):
            fleet.watch(a.sid, a.tokens)
        elif isinstance(a, Move):
            fleet.move(a.sid, a.src, a.dst, a.generated, a.recompute)
        elif isinstance(a, Rebalance):
            scheduler.on_moved([fleet.move(sid, a.src, a.dst, None, False) for sid in rebalance_choice(fleet, a)])


def rebalance_choice(fleet: Fleet, a: Rebalance) -> list[SampleId]:
    """The `a.count` samples of `a.src` cheapest to move: waiting ones first, the last queued first
    (they would start last), then running ones with the fewest generated tokens (ties: lower id)."""
    chosen = list(fleet.waiting(a.src))[::-1][: a.count]
    if len(chosen) < a.count:
        running = sorted(fleet.running(a.src), key=lambda sid: (fleet.generated(sid), sid))
        chosen += running[: a.count - len(chosen)]
    return chosen


def steal(scheduler: Scheduler, fleet: Fleet, idle: int, step: int) -> list[Move]:
    """Work stealing: idle worker `idle` offers to take unstarted samples of `step` from the others
    (they need no KV cache moved); the scheduler picks (on_idle) and the fleet hands them over."""
    waiting: dict[int, list[SampleId]] = {}
    for v in range(scheduler.workers):
        if v != idle and (sids := list(fleet.unstarted(v, step))):
            waiting[v] = sids
    if not waiting:
        return []
    moves = scheduler.on_idle(idle, step, waiting)
    for m in moves:
        fleet.hand_over(m)
    return moves
