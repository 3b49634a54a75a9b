"""What one pod's process does (`rhymerl worker --role ROLE --spec FILE`, the command the operator's
pod templates name): the controller pod runs the job (controller_pod.py); every other pod joins the
head with its role and stays up.

When the head goes away (the controller pod restarted) a member's Ray node ends and it joins the
next head when that answers, so a controller restart restarts no other container. On SIGTERM (a
scale-down, a spot notice, a drain) a rollout pod forwards the notice to its rollout workers, which
hand their samples back with their tokens (workers/roles/rollout_worker.py), waits for them to be
gone, and exits 0 within its grace period. Every pod serves /healthz, /readyz and /metrics on
RHYMERL_HTTP_PORT.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry

from rhymerl.api import RLJob
from rhymerl.api.roles import REJOIN_EXIT_CODE, Role, workers_per_pod
from rhymerl.workers.roles.leave_notice import NODE_DIR_ENV, PID_SUFFIX
from rhymerl.workers.roles.worker_metrics import METRICS_DIR_ENV
from rhymerl.workers.run_folder.identity import JOB_UID_ENV, record
from rhymerl.workers.runtime import node
from rhymerl.workers.runtime.controller_pod import PodStatus, Stop, on_sigterm, run_controller
from rhymerl.workers.runtime.endpoints import Endpoints
from rhymerl.workers.runtime.pod_env import SAY_EVERY_S, claim_run_dir, object_store_bytes, pod_env

GRACE_MARGIN_S = 5.0  # of a pod's grace period, kept for stopping its Ray node after its workers left
JOIN_TRIES = 5


def serve_pod(job: RLJob, role: Role, status_for: Callable[[RLJob], PodStatus]) -> int:
    """The pod's life as `role`, until SIGTERM; its exit code. `status_for`: the controller's channel to
    its RLJob."""
    scratch = Path(os.environ.get("HOME") or "/tmp")
    metrics_dir = scratch / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    os.environ[METRICS_DIR_ENV] = str(metrics_dir)  # inherited by the Ray node, so by this pod's workers
    os.environ[NODE_DIR_ENV] = str(scratch / "node")  # where this pod's rollout workers leave their pid files
    registry = CollectorRegistry()
    endpoints = Endpoints(int(pod_env("RHYMERL_HTTP_PORT", "9090")), registry, metrics_dir)
    try:
        if role == "controller":
            signal.signal(signal.SIGTERM, on_sigterm)
            try:
                return run_controller(job, registry, endpoints, scratch, status_for)
            except Stop:
                return 0
        return run_member(job, role, endpoints, scratch)
    finally:
        endpoints.close()


def run_member(job: RLJob, role: Role, endpoints: Endpoints, scratch: Path) -> int:
    """Join the head, and the next one whenever it goes away, until SIGTERM."""
    from rhymerl.workers.runtime.gpu_probe import preflight

    preflight(job, role)  # a GPU pod lacking its driver or compiler ends here, in one line
    address = pod_env("RHYMERL_CONTROLLER")
    if role == "train" and os.environ.get(JOB_UID_ENV):  # its checkpoints: not an earlier job's of its name
        path, claimed = claim_run_dir()
        if claimed.note:
            print(f"train: {claimed.note}", flush=True)
        path.mkdir(parents=True, exist_ok=True)
        record(path, os.environ.get(JOB_UID_ENV))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    log = scratch / "ray-node.log"
    said = -SAY_EVERY_S
    failed = 0  # joins in a row whose node never started
    while not stopping.is_set():
        if failed >= JOIN_TRIES:  # something in this container is stale: a fresh one joins (not a crash)
            print(f"{role}: could not join the Ray head at {address} {failed} times in a row (see {log}); exiting "
                  f"{REJOIN_EXIT_CODE} for a fresh container", file=sys.stderr, flush=True)
            return REJOIN_EXIT_CODE
        if not node.reachable(address):
            if time.monotonic() - said >= SAY_EVERY_S:
                print(f"{role}: waiting for the Ray head at {address}", flush=True)
                said = time.monotonic()
            stopping.wait(1.0)
            continue
        # a StatefulSet's pod of ordinal 0 keeps its volume, the run's checkpoints, across restarts
        lead = role == "train" and os.environ.get("RHYMERL_POD_NAME", "").rpartition("-")[2] == "0"
        before = log.stat().st_size if log.is_file() else 0  # the log is appended to by every join
        ray_node = node.join(address, role, log, object_store_bytes(), workers_per_pod(job, role), lead)
        try:
            if started(ray_node, log, before, stopping):
                failed = 0
                endpoints.ready.set()
                print(f"{role}: joined the Ray head at {address}", flush=True)
            else:
                failed += 1
            while ray_node.poll() is None and not stopping.is_set():
                stopping.wait(0.5)
            endpoints.ready.clear()
            if stopping.is_set():
                if role == "rollout":
                    hand_back(scratch / "node", _grace_s())
                return 0
            print(f"{role}: the Ray node exited ({ray_node.returncode}): the head went away; joining the next one",
                  flush=True)
        finally:
            node.stop(ray_node)
        said = time.monotonic()
    return 0


def hand_back(node_dir: Path, grace_s: float) -> None:
    """SIGTERM to this pod's rollout workers (each hands its samples back, and the step loop stops it
    once they are safe); wait for them to be gone, at most until the grace period runs short."""
    pids = []
    for pid_file in node_dir.glob(f"*{PID_SUFFIX}"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
    deadline = time.monotonic() + max(1.0, grace_s - GRACE_MARGIN_S)
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.2)
    print(f"rollout: handed back; {len(pids)} worker(s) still up at the end of the grace period" if pids else
          "rollout: handed back; every rollout worker of this pod is gone", flush=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie is gone for our purpose
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
            return False
    return True


def _grace_s() -> float:
    """The pod's grace period (its template's, which the operator passes in its environment)."""
    return float(os.environ.get("RHYMERL_GRACE_S", "30"))


class Polled(Protocol):
    """A process: its exit code, None while it runs."""

    def poll(self) -> int | None: ...


def started(ray_node: Polled, log: Path, after: int, stopping: threading.Event, timeout_s: float = 120.0) -> bool:
    """Whether this join's node started: its own lines of the log (those past byte `after`; an earlier
    join's "started" says nothing of this one) say so before it exits or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and ray_node.poll() is None and not stopping.is_set():
        with contextlib.suppress(OSError), log.open("rb") as f:
            f.seek(after)
            if b"Ray runtime started" in f.read():
                return True
        time.sleep(0.5)
    return False
