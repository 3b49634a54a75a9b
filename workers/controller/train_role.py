"""The train role as the step loop reaches it: one rank, or several that train together.

Collective calls (`call`, `call2`, `save`) go to every rank, in the same order, and their result is rank 0's; a
rank that fails or dies while the others wait in a collective shows up as its own error (`get`
watches every rank, not only rank 0, which would wait on the lost one until the collective's
timeout). Everything else (`lead`) is rank 0's alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Concatenate, ParamSpec, TypeVar

from rhymerl.errors import UserError
from rhymerl.workers.controller.role_apis import TrainAPI, Weights
from rhymerl.workers.controller.transport import Handle, Result, Transport
from rhymerl.workers.run_folder.in_flight import InFlight
from rhymerl.workers.run_folder.loop_state import LoopState

P = ParamSpec("P")
R = TypeVar("R")
R1 = TypeVar("R1")
R2 = TypeVar("R2")

POLL_S = 0.05


class TrainRole:
    def __init__(self, t: Transport, start: Callable[[int, int], Handle[TrainAPI]], world: int) -> None:
        """start(rank, world): a new train worker of that rank."""
        if world > 1 and not t.concurrent:
            raise UserError(f"train.replicas: {world} train ranks run as processes of their own (backend: ray); the "
                            "local backend trains in this process, with one")
        self.t = t
        self.ranks: list[Handle[TrainAPI]] = []
        self._watched: list[Result[object]] = []
        try:
            for rank in range(world):
                self.ranks.append(start(rank, world))
            if world > 1:
                host, port = t.get(t.call(self.ranks[0], TrainAPI.listen))
                self.get(self.call(TrainAPI.join, host, port))
        except BaseException:
            self.stop()
            raise
        self.lead = self.ranks[0]

    def call(self, method: Callable[Concatenate[TrainAPI, P], R], *args: P.args, **kwargs: P.kwargs) -> Result[R]:
        """A collective call on every rank; rank 0's result."""
        results = [self.t.call(h, method, *args, **kwargs) for h in self.ranks]
        self._watched = list(results[1:])
        return results[0]

    def call2(self, method: Callable[Concatenate[TrainAPI, P], tuple[R1, R2]], *args: P.args,
              **kwargs: P.kwargs) -> tuple[Result[R1], Result[R2]]:
        """A collective call of a method returning a pair; rank 0's halves."""
        results = [self.t.call2(h, method, *args, **kwargs) for h in self.ranks]
        self._watched = [r for pair in results[1:] for r in pair]
        return results[0]

    def save(self, state: LoopState, in_flight: InFlight,
             policies: Sequence[Weights | Result[Weights]]) -> Result[str | None]:
        """The collective checkpoint (TrainAPI.save); `policies` go to rank 0 alone (only it writes them)."""
        lead = [self.t.arg(w) for w in policies]
        results = [self.t.call(h, TrainAPI.save, state, in_flight, *(lead if h is self.ranks[0] else ()))
                   for h in self.ranks]
        self._watched = list(results[1:])
        return results[0]

    def get(self, result: Result[R]) -> R:
        """Rank 0's result of the last collective call, once every rank finished it; the first
        error of any rank, as soon as it comes."""
        others, self._watched = self._watched, []
        while others and not self.t.done(result):
            for ref in [r for r in others if self.t.done(r)]:
                self.t.get(ref)  # raises what that rank raised, or WorkerGone
                others.remove(ref)
            time.sleep(POLL_S)
        value = self.t.get(result)
        for ref in others:
            self.t.get(ref)
        return value

    def stop(self) -> None:
        for h in self.ranks:
            self.t.stop(h)
