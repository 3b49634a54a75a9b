"""How many threads a role worker computes with.

On one machine the step loop says (every worker as many as its own process, so the arithmetic,
and the tokens, are the in-process run's). On a job's pod each worker takes its own pod's CPU
limit, or without one its CPU request: not the controller pod's count, and not what the process
would pick itself (torch counts the node's cores, and Ray sets OMP_NUM_THREADS=1 in a worker that
reserved no CPU, as ours do).

With spec.rollout.adaptive_threads the torch engine's decode passes run at the count a
ThreadChooser picks from their times (fewer threads on a machine other processes keep busy); the
count is torch's, for the whole process, so one chooser serves every rollout worker of a process
(`chooser`), and other computing (training, measuring the verify-cost profile) sets the configured
count back first (`use_threads`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from rhymerl.algorithms.thread_choice import ThreadChooser
from rhymerl.api.roles import CPU_REQUEST_ENV

CGROUP = Path("/sys/fs/cgroup")


def cpu_limit(cgroup: Path = CGROUP) -> int | None:
    """This container's CPU limit, rounded up (cgroup v2 cpu.max, else v1's CFS quota), at most the
    CPUs this process may run on; None without a limit."""
    quota = period = None
    try:
        text = (cgroup / "cpu.max").read_text().split()
        if text and text[0] != "max":
            quota, period = float(text[0]), float(text[1])
    except (OSError, ValueError, IndexError):
        try:
            q = float((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
            if q > 0:
                quota, period = q, float((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            pass
    if quota is None or not period:
        return None
    return max(1, min(math.ceil(quota / period), len(os.sched_getaffinity(0))))


def cpu_request(environ: Mapping[str, str] = os.environ) -> int | None:
    """The pod's CPU request in cores (CPU_REQUEST_ENV, set by the operator), at most the CPUs this
    process may run on; None where it is not set or not a positive count."""
    value = environ.get(CPU_REQUEST_ENV, "")
    return max(1, min(int(value), len(os.sched_getaffinity(0)))) if value.isdigit() and int(value) > 0 else None


POD_ENV = "RHYMERL_ROLE"
"""Set in every pod of a job (operator/manifests/roles.py), inherited by the Ray workers it hosts."""


def apply_threads(threads: int | None, share: int = 1) -> int:
    """torch's intra-op threads: `threads`; None: on a job's pod its CPU limit, else its CPU request
    (else the CPUs the process may run on) over the `share` workers of the pod, elsewhere the
    process's own setting. Returns the count, the one a worker computes at (`use_threads`)."""
    n = threads if threads is not None else \
        max(1, (cpu_limit() or cpu_request() or len(os.sched_getaffinity(0))) // share) if POD_ENV in os.environ \
        else None
    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def use_threads(n: int) -> None:
    """torch at `n` threads, unless it is already (a change restarts torch's thread pool: ~2 ms)."""
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


_CHOOSERS: dict[int, ThreadChooser] = {}


def chooser(configured: int) -> ThreadChooser:
    """This process's ThreadChooser from `configured` threads: rollout workers sharing a process
    share torch's count, so they share its choice rather than switch it back and forth."""
    if configured not in _CHOOSERS:
        _CHOOSERS[configured] = ThreadChooser(configured)
    return _CHOOSERS[configured]
