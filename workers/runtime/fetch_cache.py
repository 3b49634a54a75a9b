"""The lock that makes a model cache claim (spec.model.cache) fetch each source once, whatever the number
of pods and jobs starting on it at the same time (workers/runtime/fetch.py composes it with the fetch).

An exclusive `fcntl.flock` on a lock file beside the source's folder: on a ReadWriteMany claim the file
system carries it to every client (NFS v4 as byte-range locks, which EFS and Filestore serve; CephFS;
Azure Files over NFS), and it goes with its holder: the kernel drops it when the process dies, an NFS
server when the dead client's lease ends (about 90 s). A waiter polls for it (a blocking flock cannot be
given up at the fetch's deadline), backing off to one try every MAX_POLL_S.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rhymerl.errors import UserError, user_paths
from rhymerl.workers.runtime.fetch_deadline import Deadline

FIRST_POLL_S = 0.05
MAX_POLL_S = 2.0


class LockTimeout(UserError):
    pass


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def exclusive(lock: Path, deadline: Deadline, waiting: Callable[[], None]) -> Iterator[None]:
    """Hold the exclusive lock on `lock` (created if need be) inside; `waiting()` once if another process
    holds it, and a LockTimeout if it still does at the deadline."""
    with user_paths("open the cache lock", lock):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o664)
    try:
        pause = FIRST_POLL_S
        if not _try_lock(fd):
            waiting()
            while not _try_lock(fd):
                if deadline.left() <= 0:
                    raise LockTimeout(f"the lock {lock} was still held by another pod fetching it")
                time.sleep(min(pause, deadline.left()))
                pause = min(pause * 2, MAX_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock
