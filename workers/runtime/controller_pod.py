"""The controller pod's run: it starts the Ray head, waits for the pods the run needs (however long
that takes, saying what it waits for in its RLJob's status.progress.message: a Pending job, never a
Failed one), then runs the job's steps on their workers, resuming from its run folder when one is
there (a restarted controller pod) and it is this job's (a run folder records its RLJob's uid:
workers/run_folder/identity.py).

A member of the run lost for good (a train pod evicted, drained or OOM-killed, its Ray node gone)
ends the run with MEMBER_LOST_EXIT_CODE, not a crash of this pod: the restarted controller waits for
the pods and resumes from the last checkpoint. Its rollout fleet follows the RLJob's
spec.rollout.replicas while it runs (in a cluster; elsewhere `rhymerl scale`), read through the
pod's status channel (PodStatus: the CLI's, which talks to the cluster).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry

from rhymerl.api import RLJob
from rhymerl.api.roles import MEMBER_LOST_EXIT_CODE
from rhymerl.workers.roles.worker_metrics import ControllerMetrics
from rhymerl.workers.run_folder.identity import JOB_UID_ENV, record
from rhymerl.workers.runtime import node
from rhymerl.workers.runtime.endpoints import Endpoints
from rhymerl.workers.runtime.pod_env import SAY_EVERY_S, claim_run_dir, object_store_bytes, pod_env

if TYPE_CHECKING:
    from rhymerl.workers.run_folder.run_dir import RunDir

JOIN_TIMEOUT_S = 900.0  # the controller's own head must answer its own driver within this


class PodStatus(Protocol):
    """The controller pod's channel to its RLJob: status.progress (each step, and what it waits for),
    and the spec's rollout.replicas."""

    def say(self, message: str) -> None: ...

    def pods_in_use(self, pods: int | None) -> None:
        """status.progress.rolloutPodsInUse: how many leading rollout pod ordinals hold the fleet's workers."""
        ...

    def progress(self, row: Mapping[str, Any], finished: bool) -> None: ...

    def wanted(self) -> Callable[[], int] | None:
        """The rollout workers the job wants now (None: none said; the run folder's scale file)."""
        ...


class Stop(Exception):
    """SIGTERM reached the controller pod."""


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Stop


def open_run(job: RLJob, status: PodStatus) -> tuple[RunDir, RLJob, bool]:
    """The controller's run folder, its job (the one the run began with, when resuming) and whether it resumes."""
    from rhymerl.workers.run_folder.run_dir import RunDir

    path, claimed = claim_run_dir()
    run = RunDir(path)
    resume = (run.path / "spec.yaml").is_file()
    if resume:
        saved = run.open()
        if saved.spec != job.spec:
            run.note("the job's spec changed since this run began; resuming with the spec it began with")
        job = saved
    else:
        run.create(job)
    record(run.path, os.environ.get(JOB_UID_ENV))
    if claimed.note:
        run.note(claimed.note)
    how = "resuming" if resume else "starting fresh" if claimed.fresh else "running"
    status.say(f"{how} {job.metadata.name} in {run.path}" + (f": {claimed.note}" if claimed.note else ""))
    return run, job, resume


def member_lost_exit(failure: BaseException, head_alive: bool) -> int | None:
    """The controller's exit code for a run ended by `failure`: MEMBER_LOST_EXIT_CODE for a member of the
    run lost (not counted as this pod's crash) while this pod's own Ray head is alive; None where the
    failure is raised as itself (exit 1 for a RunFailed: the controller's own fault)."""
    from rhymerl.workers.runtime.ray_backend import MemberLost

    return MEMBER_LOST_EXIT_CODE if isinstance(failure, MemberLost) and head_alive else None


def run_controller(job: RLJob, registry: CollectorRegistry, endpoints: Endpoints, scratch: Path,
                   status_for: Callable[[RLJob], PodStatus]) -> int:
    """The controller pod's life: the head, the run, then idle until stopped (`status_for`: the
    job's status channel, opened once the head answers)."""
    address = pod_env("RHYMERL_CONTROLLER")
    port = int(address.rpartition(":")[2])
    head_log = scratch / "ray-head.log"
    head = node.start_head(port, "controller", head_log, object_store_bytes())
    try:
        node.connect(f"{os.environ.get('RHYMERL_POD_IP') or '127.0.0.1'}:{port}", JOIN_TIMEOUT_S, head, head_log)
        signal.signal(signal.SIGTERM, on_sigterm)  # ray.init installed its own (which aborts)
        status = status_for(job)
        node.wait_for_roles(job, lambda msg: status.say(msg), SAY_EVERY_S)
        run, job, resume = open_run(job, status)
        metrics = ControllerMetrics(registry)
        endpoints.ready.set()
        return _run_steps(job, run, resume, metrics, status, head.poll)
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        node.stop(head)


def _run_steps(job: RLJob, run: RunDir, resume: bool, metrics: ControllerMetrics, status: PodStatus,
               head_exit: Callable[[], int | None]) -> int:
    from rhymerl.workers.controller.scale import ScaleFile
    from rhymerl.workers.controller.stopping import RunStopped
    from rhymerl.workers.runtime.ray_backend import MemberLost, run_steps_ray

    wanted = status.wanted() or ScaleFile(run.path, job)
    try:
        for row in run_steps_ray(job, run, resume, None, None, wanted, status.say, status.pods_in_use):
            metrics.update(row)
            print(f"controller: step {row.step} epoch {row.epoch} reward {row.reward_mean:.4f} "
                  f"time {row.time_step_s}s lag {row.policy_lag_max} workers {row.rollout_workers}", flush=True)
            status.progress(row.row(), False)
    except RunStopped as stopped:  # evicted or preempted: the step ran to its end and was checkpointed
        print(f"controller: {stopped}; the restarted pod resumes from it", flush=True)
        return 0
    except MemberLost as lost:
        code = member_lost_exit(lost, head_exit() is None)
        if code is None:
            raise
        run.note(f"{lost}; exiting {code}: the restarted controller resumes from the last checkpoint once "
                 "the pods are back (a member's loss, not this pod's crash)")
        print(f"controller: {lost}; exiting {code} to resume once the pods are back", file=sys.stderr, flush=True)
        return code
    finally:
        run.close()
    rows = run.metrics()
    if rows:
        status.progress(rows[-1], True)
    print(f"controller: {job.metadata.name} finished ({len(rows)} steps); idle until stopped", flush=True)
    threading.Event().wait()
    return 0
