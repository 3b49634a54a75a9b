"""The simulator's event queue: what is due when, in the order it was pushed among equal times."""

from __future__ import annotations

import heapq

from .state import SimWorker
from .timing import DecodeModel

WORKER = 0
"""A worker reaches its next event; arg: index << 32 | the worker's version (older versions are stale)."""
TRAINED = 1
"""A step has trained and its weights reached the workers; arg: the step."""
GATE = 2
"""Gates may have opened (a step completed, the run started); arg: 0."""
FLEET = 3
"""An event of the fleet hooks (elastic.py); arg: theirs."""
TOOL = 4
"""A tool call answered; arg: the sample."""


class EventQueue:
    """A heap of (time, push order, kind, arg)."""

    def __init__(self, decode: DecodeModel) -> None:
        self.decode = decode
        self.heap: list[tuple[float, int, int, int]] = []
        self._counter = 0

    def push(self, t: float, kind: int, arg: int) -> None:
        self._counter += 1
        heapq.heappush(self.heap, (t, self._counter, kind, arg))

    def pop(self) -> tuple[float, int, int, int]:
        return heapq.heappop(self.heap)

    def __bool__(self) -> bool:
        return bool(self.heap)

    def schedule(self, w: SimWorker) -> None:
        """The worker's next event replaces the one it had (its version moves on)."""
        w.version += 1
        nxt = self.decode.next_it(w)
        if nxt is None:
            return
        t = w.clock + self.decode.seg_time(w, nxt)
        self.push(t, WORKER, w.idx * (1 << 32) + w.version)
