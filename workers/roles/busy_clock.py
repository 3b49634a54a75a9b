"""The seconds a rollout worker spent working: a call's duration, and the pass times the torch
engine's draft cap is priced from, must be the worker's own, not its turns' gaps."""

from __future__ import annotations

import time


class BusyClock:
    """Stands still while a call sits at a yield waiting to be stepped on (in the step loop's process
    the workers take turns) and between calls."""

    def __init__(self) -> None:
        self._total = 0.0
        self._since: float | None = None

    def pause(self) -> None:
        if self._since is not None:
            self._total += time.perf_counter() - self._since
            self._since = None

    def resume(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    def now(self) -> float:
        return self._total + (time.perf_counter() - self._since if self._since is not None else 0.0)
