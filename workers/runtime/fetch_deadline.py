"""How long `rhymerl fetch` may wait, and the clock that makes it stop (workers/runtime/fetch.py).

A pod's fetch step that waits on a server that accepted the connection and never answers would keep
the pod in Init forever; so every fetch has a connect timeout, a read timeout (for the first byte of
each answer and between chunks) and a deadline for the whole command. The libraries get the first two;
the deadline does not trust them: the download runs in a worker thread that the caller waits for
until the deadline. Every file the worker writes itself (an S3 object, a claim's file) is written under
a lock that the caller takes to stop it before it removes the `.partial` folder, so nothing is written
there after it is gone; huggingface_hub writes its own files, and is stopped by refusing its next
request (fetch.py) and by the command's exit.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

from rhymerl.errors import OptionError

CONNECT_ENV = "FETCH_CONNECT_TIMEOUT_S"
READ_ENV = "FETCH_READ_TIMEOUT_S"
DEADLINE_ENV = "FETCH_DEADLINE_S"
INSTANCE_ENV = "FETCH_S3_INSTANCE_CREDENTIALS"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
_STOP_WAIT_S = 5.0  # how long the caller waits for a worker busy writing one chunk before it clears anyway
T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    """A fetch's timeouts in seconds, and whether S3 may ask the instance metadata service for
    credentials (off by default: see fetch.py)."""

    connect_s: float = 10.0
    read_s: float = 60.0
    deadline_s: float = 7200.0
    instance_credentials: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Limits:
        """The defaults, each replaced by its environment variable where set."""
        flag = environ.get(INSTANCE_ENV, "").strip().lower()
        if flag not in _TRUE + _FALSE:
            raise OptionError(f"{INSTANCE_ENV}={flag!r}: not true or false")
        return cls(_env_seconds(environ, CONNECT_ENV, cls.connect_s), _env_seconds(environ, READ_ENV, cls.read_s),
                   _env_seconds(environ, DEADLINE_ENV, cls.deadline_s), flag in _TRUE)

    def overridden(self, connect_s: float | None = None, read_s: float | None = None,
                   deadline_s: float | None = None, instance_credentials: bool = False) -> Limits:
        """These limits with the command line's options, where given, in place of the environment's."""
        given = {"connect_s": ("--connect-timeout", connect_s), "read_s": ("--read-timeout", read_s),
                 "deadline_s": ("--deadline", deadline_s)}
        changes = {field: seconds(value, option) for field, (option, value) in given.items() if value is not None}
        return replace(self, **changes, instance_credentials=self.instance_credentials or instance_credentials)


def seconds(value: float | str, name: str) -> float:
    """`value` as a positive, finite number of seconds; an OptionError naming `name` if it is not one."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise OptionError(f"{name}={value}: not a positive number of seconds")
    return number


def _env_seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    value = environ.get(name, "").strip()
    return seconds(value, name) if value else default


class Stopped(Exception):
    """Raised in the worker when the deadline has passed or the caller stopped it: it only unwinds the
    worker, whose caller reports the deadline."""


class Deadline:
    """The whole command's clock, shared by its fetches, and the stop switch of the worker writing."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.ends = time.monotonic() + limits.deadline_s
        self._stopped = threading.Event()
        self._writing = threading.Lock()

    def left(self) -> float:
        """Seconds until the deadline (0 once it has passed)."""
        return max(0.0, self.ends - time.monotonic())

    def check(self) -> None:
        """Raise Stopped if the deadline has passed or the worker was stopped."""
        if self._stopped.is_set() or self.left() <= 0:
            raise Stopped(f"the {self.limits.deadline_s:g} s deadline passed")

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold while creating or writing a file under `.partial`: `stop` waits for the holder."""
        with self._writing:
            self.check()
            yield

    @contextmanager
    def stop(self) -> Iterator[None]:
        """Stop the worker: inside, no file is being written and none will be, unless a write outlasted
        _STOP_WAIT_S (a disk that hangs); the caller removes what the worker wrote inside."""
        held = self._writing.acquire(timeout=_STOP_WAIT_S)
        self._stopped.set()
        try:
            yield
        finally:
            if held:
                self._writing.release()

    def run(self, work: Callable[[], T]) -> T:
        """`work()` in a worker thread, waited for until the deadline: its result or its exception, or
        Stopped when the deadline passes first (the worker is then stopped by the caller's `stop`)."""
        outcome: list[T] = []
        failure: list[BaseException] = []

        def worker() -> None:
            try:
                outcome.append(work())
            except BaseException as exc:  # handed to the caller, whatever it is
                failure.append(exc)

        thread = threading.Thread(target=worker, name="rhymerl-fetch", daemon=True)
        thread.start()
        thread.join(self.left())
        if thread.is_alive():
            raise Stopped(f"the {self.limits.deadline_s:g} s deadline passed")
        if failure:
            raise failure[0]
        return outcome[0]
