"""The train role as the step loop reaches it: one rank, or several that train together.

Collective calls (`call`) go to every rank, in the same order, and their result is rank 0's; a
rank that fails or dies while the others wait in a collective shows up as its own error (`get`
watches every rank, not only rank 0, which would wait on the lost one until the collective's
timeout). Everything else (`lead`) is rank 0's alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rhymerl.errors import UserError
from rhymerl.workers.controller.transport import Transport

POLL_S = 0.05


class TrainRole:
    def __init__(self, t: Transport, start: Callable[[int, int], Any], world: int) -> None:
        """start(rank, world): a new train worker of that rank."""
        if world > 1 and not t.concurrent:
            raise UserError(f"train.replicas: {world} train ranks run as processes of their own (backend: ray); the "
                            "local backend trains in this process, with one")
        self.t = t
        self.ranks: list[Any] = []
        self._watched: list[Any] = []
        try:
            for rank in range(world):
                self.ranks.append(start(rank, world))
            if world > 1:
                host, port = t.get(t.call(self.ranks[0], "listen"))
                self.get(self.call("join", host, port))
        except BaseException:
            self.stop()
            raise
        self.lead = self.ranks[0]

    def call(self, method: str, *args: Any, returns: int = 1, lead: tuple[Any, ...] = ()) -> Any:
        """A collective call on every rank; rank 0's result (references on Ray). `lead`: more
        arguments for rank 0 alone (what only it uses, not shipped to the others)."""
        results = [self.t.call(h, method, *args, *(lead if h is self.ranks[0] else ()), returns=returns)
                   for h in self.ranks]
        self._watched = [r for res in results[1:] for r in (res if returns > 1 else (res,))]
        return results[0]

    def get(self, result: Any) -> Any:
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
