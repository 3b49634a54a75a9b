"""One process at a time per run folder.

Two `rhymerl run --resume` on one folder would both append steps (metrics counted twice, dumps
overwritten). The lock is an advisory `flock` on `run.lock` inside the folder: the kernel drops it
when the holder exits in any way (SIGKILL included), so a dead run never blocks the next one and
no stale-lock cleanup is needed. The file's text names the holder, for the error a second process
prints; it is informational only, the flock is the lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType

from rhymerl.errors import UserError

LOCK = "run.lock"


class RunLocked(UserError):
    """Another process holds the run folder."""


class RunLock:
    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLocked(f"{self.path.parent} is in use by {self.holder()}; wait for that run to end "
                            "or stop it, then resume") from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(),
                  "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        self._fd = fd

    def holder(self) -> str:
        try:
            info = json.loads(self.path.read_text())
            return f"pid {info['pid']} on {info['host']} since {info['since']} ({info['command']})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __del__(self) -> None:
        self.release()

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
