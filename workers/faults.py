"""Named crash points, so tests can kill a real run at every phase of a step.

`RHYMERL_CRASH_AT=NAME:STEP[,NAME:STEP...]` makes the process SIGKILL itself when it reaches point NAME while
working on step STEP: no `finally`, no flush, no exit handler runs, exactly as when the kernel's
OOM killer or a spot reclaim takes a pod. Without the variable a point costs one dict lookup. The
points (docs/formats.md, "Crash safety"): rollout, train, dump, metrics, checkpoint-files,
checkpoint-manifest, checkpoint-renamed; and, in the distributed runtime's role workers,
rollout-worker, reward-worker, history-worker, weight-receive (its STEP the policy version a
rollout worker is about to receive over a broadcast) (workers/roles/).

A worker that is restarted after such a crash (Ray restarts actors) would reach the same point
again; with `RHYMERL_CRASH_ONCE_DIR` set, each point fires once: a marker file in that folder,
written before the kill, records that it did. `RHYMERL_CRASH_SIGNAL=SIGTERM` sends that signal instead
of SIGKILL: what an eviction or a spot reclaim's notice sends first (workers/controller/stopping.py);
`RHYMERL_CRASH_SIGNAL=ENOSPC` raises the OSError of a full disk there instead (the points before and
inside writes: checkpoint-files, dump, metrics). `RHYMERL_CRASH_WHO=raylet` sends the signal to the
raylet of the Ray worker that reaches the point (its node lost, every worker on it with it) rather
than to the worker itself. Two points come before any step, with STEP 0: `ray-start`, where a local
Ray instance has started and this process connected to it (workers/runtime/cluster.py), and `start`,
where `rhymerl run` is about to ask for its first step (rhymerl/cli/local_run.py).

`RHYMERL_HOLD_AT=NAME:STEP[,NAME:STEP...]` with `RHYMERL_HOLD_DIR` holds a process at a point
instead, so a test can make something happen exactly there (scale the fleet, stop a pod): the first
process to reach it writes `NAME-STEP.reached` (its pid and `RHYMERL_POD_NAME`) into that folder and
waits until the test creates `NAME-STEP.go`; each point holds once. `snapshot-kept`, in the step
loop once it has kept a rollout call's snapshot (workers/controller/fleet_reports.py), is for holds:
Ray delivers a streamed item after the yield that made it, so a test that must kill a worker after
its snapshot arrived holds both there and kills it between.

`RHYMERL_FORCE=DECISION[,DECISION...]` forces a decision a cost model would otherwise make from
measured times (`forced`): `freed-drafters`, every freed rollout worker drafts for a straggling one
(`forced_costs`, workers/controller/fleet_drafters.py), so a test on real processes sees the drafts
travel between them; a fleet in the test's own process is given those costs through its `costs` seam.

Why environment variables: the processes these points stop are started by Ray, by the pods-as-processes
harness or by `rhymerl run` itself, not by the test; the environment is the one channel that reaches
every one of them (Ray passes it to its workers, a pod to its containers) without an API that exists only
for tests. One module reads them all, at named points, as etcd's gofail and FreeBSD's fail(9) do; a test
that runs its code in its own process injects what it steers instead (a fleet's costs, a clock, a
transport), and no other module reads a test-steering variable.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

ENV = "RHYMERL_CRASH_AT"
HOLD_ENV = "RHYMERL_HOLD_AT"
HOLD_DIR_ENV = "RHYMERL_HOLD_DIR"
ONCE_ENV = "RHYMERL_CRASH_ONCE_DIR"
SIGNAL_ENV = "RHYMERL_CRASH_SIGNAL"
WHO_ENV = "RHYMERL_CRASH_WHO"
FORCE_ENV = "RHYMERL_FORCE"


def point(name: str, step: int) -> None:
    holds = os.environ.get(HOLD_ENV)
    if holds is not None and f"{name}:{step}" in holds.split(","):
        _hold(f"{name}-{step}")
    target = os.environ.get(ENV)
    if target is None or f"{name}:{step}" not in target.split(","):
        return
    once = os.environ.get(ONCE_ENV)
    if once is not None:
        marker = Path(once) / f"{name}-{step}"
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            return
    how = os.environ.get(SIGNAL_ENV, "SIGKILL")
    if how == "ENOSPC":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    who = os.getpid() if os.environ.get(WHO_ENV) != "raylet" else int(os.environ["RAY_RAYLET_PID"])
    os.kill(who, signal.Signals[how])


def forced(decision: str) -> bool:
    """Whether RHYMERL_FORCE names `decision`."""
    return decision in os.environ.get(FORCE_ENV, "").split(",")


def _hold(marker: str) -> None:
    folder = Path(os.environ[HOLD_DIR_ENV])
    mine = folder / f"{marker}.{os.getpid()}"
    mine.write_text(f"{os.getpid()} {os.environ.get('RHYMERL_POD_NAME', '')}\n")
    try:
        os.link(mine, folder / f"{marker}.reached")  # whole, and only for the first process to get here
    except FileExistsError:
        return
    finally:
        mine.unlink()
    while not (folder / f"{marker}.go").exists():
        time.sleep(0.05)
