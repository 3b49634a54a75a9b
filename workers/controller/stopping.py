"""Stopping a run between steps, on SIGTERM.

Kubernetes sends SIGTERM when it evicts a pod or reclaims a spot node, and waits the pod's grace
period before SIGKILL; `kill` of a local run does the same. Dying at once would throw away every
step since the last periodic checkpoint. Instead the step that is running finishes, a checkpoint
is saved after it (whatever `checkpoint.every_steps` says) and the run ends with `RunStopped`, so
`--resume` (or the restarted controller pod) goes on from exactly there. A second SIGTERM stops
at once (`Terminated`), for when the step would outlast the grace period anyway.

Outside the steps (starting up: the run folder, Ray, the workers; or after the last step) there is
no step to finish: `stop_signals` makes SIGTERM raise `Terminated` and Ctrl-C KeyboardInterrupt
wherever the run is, so every `finally` on the way out runs (the Ray processes are stopped, a
folder with no finished step is removed). `held_signals` keeps a signal that arrives while code
that must not be cut half-way runs (Ray's start-up, which would put its own handlers in place) until
that code is done.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any

TERMINATED = 128 + signal.SIGTERM  # the shell's code for a command ended by SIGTERM


class RunStopped(Exception):
    """The run stopped after `step` on a signal, with a checkpoint of that step."""

    def __init__(self, step: int, signal_name: str) -> None:
        super().__init__(f"stopped on {signal_name} after step {step}, with a checkpoint of it")
        self.step = step
        self.signal_name = signal_name


class Terminated(SystemExit):
    """SIGTERM where no step could be finished first: the run stops where it is, exit 143 (as a
    SystemExit it ends the process with that code wherever it is not caught)."""

    def __init__(self, signal_name: str = "SIGTERM") -> None:
        super().__init__(TERMINATED)
        self.signal_name = signal_name

    def __str__(self) -> str:
        return f"stopped on {self.signal_name}"


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _raise_for(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signal.Signals(signum).name)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def stop_signals() -> Iterator[None]:
    """While inside (in the main thread), SIGTERM raises Terminated and SIGINT KeyboardInterrupt; a
    signal this process was started ignoring (a shell's background job) stays ignored."""
    if not _main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s, handler in previous.items():
        if handler is not signal.SIG_IGN and handler is not None:
            signal.signal(s, _raise_for)
    try:
        yield
    finally:
        for s, handler in previous.items():
            if handler is not signal.SIG_IGN and handler is not None:
                signal.signal(s, handler)


@contextmanager
def held_signals() -> Iterator[None]:
    """SIGTERM and SIGINT that arrive inside are noted, then handed to the handlers that were in
    place before, once the code inside is done; those handlers are put back first (at the C level
    too), so whatever a library installed inside does not outlive it."""
    if not _main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    pending: list[int] = []
    taken = [s for s, h in previous.items() if h is not signal.SIG_IGN and h is not None]
    for s in taken:
        signal.signal(s, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for s in taken:
            signal.signal(s, previous[s])
        for signum in dict.fromkeys(pending):
            handler = previous[signal.Signals(signum)]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def reassert_handlers() -> None:
    """Put this process's Python signal handlers back at the C level, after a library replaced or
    reset them there behind Python's back (Ray's shutdown resets SIGTERM to the default action)."""
    if not _main_thread():
        return
    for s in STOP_SIGNALS:
        handler = signal.getsignal(s)
        if handler is not None:
            signal.signal(s, handler)


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
            raise Terminated(self.signal_name)
        self.signal_name = signal.Signals(signum).name

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def check(self, step: int) -> None:
        """Raise RunStopped if a stop was asked for (the caller has checkpointed `step`)."""
        if self.signal_name is not None:
            raise RunStopped(step, self.signal_name)
