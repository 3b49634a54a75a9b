"""Named crash points, so tests can kill a real run at every phase of a step.

`RHYMERL_CRASH_AT=NAME:STEP` makes the process SIGKILL itself when it reaches point NAME while
working on step STEP: no `finally`, no flush, no exit handler runs, exactly as when the kernel's
OOM killer or a spot reclaim takes a pod. Without the variable a point costs one dict lookup. The
points (docs/formats.md, "Crash safety"): rollout, train, dump, metrics, checkpoint-files,
checkpoint-manifest, checkpoint-renamed.
"""

from __future__ import annotations

import os
import signal

ENV = "RHYMERL_CRASH_AT"


def point(name: str, step: int) -> None:
    target = os.environ.get(ENV)
    if target is not None and target == f"{name}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
