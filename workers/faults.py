"""Named crash points, so tests can kill a real run at every phase of a step.

`RHYMERL_CRASH_AT=NAME:STEP` makes the process SIGKILL itself when it reaches point NAME while
working on step STEP: no `finally`, no flush, no exit handler runs, exactly as when the kernel's
OOM killer or a spot reclaim takes a pod. Without the variable a point costs one dict lookup. The
points (docs/formats.md, "Crash safety"): rollout, train, dump, metrics, checkpoint-files,
checkpoint-manifest, checkpoint-renamed; and, in the distributed runtime's role workers,
rollout-worker, reward-worker, history-worker (workers/runtime/actors.py).

A worker that is restarted after such a crash (Ray restarts actors) would reach the same point
again; with `RHYMERL_CRASH_ONCE_DIR` set, each point fires once: a marker file in that folder,
written before the kill, records that it did. `RHYMERL_CRASH_SIGNAL=SIGTERM` sends that signal instead
of SIGKILL: what an eviction or a spot reclaim's notice sends first (workers/controller/stopping.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

ENV = "RHYMERL_CRASH_AT"
ONCE_ENV = "RHYMERL_CRASH_ONCE_DIR"
SIGNAL_ENV = "RHYMERL_CRASH_SIGNAL"


def point(name: str, step: int) -> None:
    target = os.environ.get(ENV)
    if target is None or target != f"{name}:{step}":
        return
    once = os.environ.get(ONCE_ENV)
    if once is not None:
        marker = Path(once) / f"{name}-{step}"
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.Signals[os.environ.get(SIGNAL_ENV, "SIGKILL")])
