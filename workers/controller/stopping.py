"""Stopping a run between steps, on SIGTERM.

Kubernetes sends SIGTERM when it evicts a pod or reclaims a spot node, and waits the pod's grace
period before SIGKILL; `kill` of a local run does the same. Dying at once would throw away every
step since the last periodic checkpoint. Instead the step that is running finishes, a checkpoint
is saved after it (whatever `checkpoint.every_steps` says) and the run ends with `RunStopped`, so
`--resume` (or the restarted controller pod) goes on from exactly there. A second SIGTERM stops
at once (SystemExit), for when the step would outlast the grace period anyway.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

TERMINATED = 128 + signal.SIGTERM  # the shell's code for a command ended by SIGTERM


class RunStopped(Exception):
    """The run stopped after `step` on a signal, with a checkpoint of that step."""

    def __init__(self, step: int, signal_name: str) -> None:
        super().__init__(f"stopped on {signal_name} after step {step}, with a checkpoint of it")
        self.step = step
        self.signal_name = signal_name


class GracefulStop:
    """While entered (in the main thread: elsewhere signals cannot be caught and this does nothing),
    SIGTERM is noted rather than fatal; the loop asks `requested` when deciding to checkpoint and
    calls `check` between steps."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)
            self._installed = True
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_name is not None:
            raise SystemExit(TERMINATED)
        self.signal_name = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def check(self, step: int) -> None:
        """Raise RunStopped if a stop was asked for (the caller has checkpointed `step`)."""
        if self.signal_name is not None:
            raise RunStopped(step, self.signal_name)
