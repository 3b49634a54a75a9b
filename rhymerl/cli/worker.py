"""`rhymerl worker --role ROLE --spec FILE`: what one pod runs (the operator's pod templates name
this command, with the environment of rhymerl.operator.manifests.roles).

The controller pod starts the Ray head, waits for the pods the run needs (however long that takes,
saying what it waits for in its RLJob's status.progress.message: a Pending job, never a Failed one),
then runs the job's steps on their workers (workers/runtime/), resuming from its run folder when one
is there (a restarted controller pod) and it is this job's (a run folder records its RLJob's uid:
workers/run_folder/identity.py). A member of the run lost for good (a train pod evicted, drained or
OOM-killed, its Ray node gone) ends the run with MEMBER_LOST_EXIT_CODE, not a crash of this pod: the
restarted controller waits for the pods and resumes from the last checkpoint. Its rollout fleet follows the RLJob's spec.rollout.replicas
while it runs (in a cluster; elsewhere `rhymerl scale`). It reports each step to status.progress.

Every other pod joins the head with its role and stays up: when the head goes away (the controller
pod restarted) its Ray node ends and it joins the next head when that answers, so a controller
restart restarts no other container. On SIGTERM (a scale-down, a spot notice, a drain) a rollout
pod forwards the notice to its rollout workers, which hand their samples back with their tokens
(workers/roles/rollout_worker.py), waits for them to be gone, and exits 0 within its grace period.
Every pod serves /healthz, /readyz and /metrics on RHYMERL_HTTP_PORT.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from rhymerl.api import RLJob
from rhymerl.api.load import load_job
from rhymerl.api.roles import MEMBER_LOST_EXIT_CODE, REJOIN_EXIT_CODE, ROLES, Role, workers_per_pod
from rhymerl.errors import UserError
from rhymerl.workers.roles.rollout_worker import NODE_DIR_ENV, PID_SUFFIX
from rhymerl.workers.roles.worker_metrics import METRICS_DIR_ENV, ControllerMetrics
from rhymerl.workers.run_folder.identity import JOB_UID_ENV, RESUME_FROM_ENV, Claim, claim, record
from rhymerl.workers.runtime import node
from rhymerl.workers.runtime.endpoints import Endpoints
from rhymerl.workers.runtime.ray_network import OBJECT_STORE_ENV

if TYPE_CHECKING:
    from rhymerl.workers.run_folder.run_dir import RunDir

JOIN_TIMEOUT_S = 900.0  # the controller's own head must answer its own driver within this
SAY_EVERY_S = 60.0  # how often a pod that waits says so again
SPEC_EVERY_S = 10.0  # how often the controller reads its RLJob's spec.rollout.replicas
GRACE_MARGIN_S = 5.0  # of a pod's grace period, kept for stopping its Ray node after its workers left
JOIN_TRIES = 5


def _env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if not value:
        raise UserError(f"{name}: not set (the operator's pod template sets it)")
    return value


class _Stop(Exception):
    pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def serve(role_name: str, spec_path: Path) -> int:
    role = next((r for r in ROLES if r == role_name), None)
    if role is None:
        raise UserError(f"--role {role_name}: one of {', '.join(ROLES)}")
    job = load_job(spec_path)
    scratch = Path(os.environ.get("HOME") or "/tmp")
    metrics_dir = scratch / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    os.environ[METRICS_DIR_ENV] = str(metrics_dir)  # inherited by the Ray node, so by this pod's workers
    os.environ[NODE_DIR_ENV] = str(scratch / "node")  # where this pod's rollout workers leave their pid files
    registry = CollectorRegistry()
    endpoints = Endpoints(int(_env("RHYMERL_HTTP_PORT", "9090")), registry, metrics_dir)
    try:
        if role == "controller":
            signal.signal(signal.SIGTERM, _on_sigterm)
            try:
                return _controller(job, registry, endpoints, scratch)
            except _Stop:
                return 0
        return _member(job, role, endpoints, scratch)
    finally:
        endpoints.close()


def _member(job: RLJob, role: Role, endpoints: Endpoints, scratch: Path) -> int:
    """Join the head, and the next one whenever it goes away, until SIGTERM."""
    from rhymerl.workers.runtime.gpu_probe import preflight

    preflight(job, role)  # a GPU pod lacking its driver or compiler ends here, in one line
    address = _env("RHYMERL_CONTROLLER")
    if role == "train" and os.environ.get(JOB_UID_ENV):  # its checkpoints: not an earlier job's of its name
        path, claimed = _claim_run_dir()
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
        ray_node = node.join(address, role, log, _object_store_bytes(), workers_per_pod(job, role), lead)
        try:
            if _started(ray_node, log, before, stopping):
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
                    _hand_back(scratch / "node", _grace_s())
                return 0
            print(f"{role}: the Ray node exited ({ray_node.returncode}): the head went away; joining the next one",
                  flush=True)
        finally:
            node.stop(ray_node)
        said = time.monotonic()
    return 0


def _hand_back(node_dir: Path, grace_s: float) -> None:
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


def _started(ray_node: Any, log: Path, after: int, stopping: threading.Event, timeout_s: float = 120.0) -> bool:
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


def _object_store_bytes() -> int | None:
    value = os.environ.get(OBJECT_STORE_ENV)  # the operator's, sized to the pod's /dev/shm
    return int(value) if value else None


def _claim_run_dir() -> tuple[Path, Claim]:
    """This pod's run folder, made its job's (workers/run_folder/identity.py: an earlier job's of the same
    name, on a volume kept by name, is moved aside unless the job asks to go on with it)."""
    from rhymerl.workers.run_folder.run_dir import pod_run_dir

    path = pod_run_dir()
    return path, claim(path, os.environ.get(JOB_UID_ENV), os.environ.get(RESUME_FROM_ENV))


def _open_run(job: RLJob, reporter: _StatusReporter) -> tuple[RunDir, RLJob, bool]:
    """The controller's run folder, its job (the one the run began with, when resuming) and whether it resumes."""
    from rhymerl.workers.run_folder.run_dir import RunDir

    path, claimed = _claim_run_dir()
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
    reporter.say(f"{how} {job.metadata.name} in {run.path}" + (f": {claimed.note}" if claimed.note else ""))
    return run, job, resume


def member_lost_exit(failure: BaseException, head_alive: bool) -> int | None:
    """The controller's exit code for a run ended by `failure`: MEMBER_LOST_EXIT_CODE for a member of the
    run lost (not counted as this pod's crash) while this pod's own Ray head is alive; None where the
    failure is raised as itself (exit 1 for a RunFailed: the controller's own fault)."""
    from rhymerl.workers.runtime.ray_transport import MemberLost

    return MEMBER_LOST_EXIT_CODE if isinstance(failure, MemberLost) and head_alive else None


def _controller(job: RLJob, registry: CollectorRegistry, endpoints: Endpoints, scratch: Path) -> int:
    from rhymerl.workers.controller.scale import ScaleFile
    from rhymerl.workers.controller.stopping import RunStopped
    from rhymerl.workers.runtime.ray_transport import MemberLost, run_steps_ray

    address = _env("RHYMERL_CONTROLLER")
    port = int(address.rpartition(":")[2])
    head_log = scratch / "ray-head.log"
    head = node.start_head(port, "controller", head_log, _object_store_bytes())
    try:
        node.connect(f"{os.environ.get('RHYMERL_POD_IP') or '127.0.0.1'}:{port}", JOIN_TIMEOUT_S, head, head_log)
        signal.signal(signal.SIGTERM, _on_sigterm)  # ray.init installed its own (which aborts)
        reporter = _StatusReporter(job)
        node.wait_for_roles(job, lambda msg: reporter.say(msg), SAY_EVERY_S)
        run, job, resume = _open_run(job, reporter)
        metrics = ControllerMetrics(registry)
        endpoints.ready.set()
        wanted = reporter.wanted() or ScaleFile(run.path, job)
        try:
            for row in run_steps_ray(job, run, resume, None, None, wanted, reporter.say, reporter.pods_in_use):
                metrics.update(row)
                print(f"controller: step {row.step} epoch {row.epoch} reward {row.reward_mean:.4f} "
                      f"time {row.time_step_s}s lag {row.policy_lag_max} workers {row.rollout_workers}", flush=True)
                reporter.progress(row.row(), False)
        except RunStopped as stopped:  # evicted or preempted: the step ran to its end and was checkpointed
            print(f"controller: {stopped}; the restarted pod resumes from it", flush=True)
            return 0
        except MemberLost as lost:
            code = member_lost_exit(lost, head.poll() is None)
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
            reporter.progress(rows[-1], True)
        print(f"controller: {job.metadata.name} finished ({len(rows)} steps); idle until stopped", flush=True)
        threading.Event().wait()
        return 0
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        node.stop(head)


def wanted_rollout(body: Mapping[str, Any], job: RLJob, last: int) -> int:
    """The rollout workers a cluster's controller wants, from its RLJob `body` as read now (`last`: the value
    before): spec.rollout.replicas within the bounds, as the operator clamps the StatefulSet's replicas; with
    spec.rollout.autoscaling on, the operator's count (status.autoscaling.replicas; max_replicas until it has
    decided one). When fewer are wanted the fleet retires the workers on the highest pod ordinals, the pods
    the StatefulSet removes, and the operator lowers the count once they are drained
    (operator/reconcile/drain.py)."""
    rollout = (body.get("spec") or {}).get("rollout") or {}
    bounds = job.spec.rollout
    if (rollout.get("autoscaling") or {}).get("enabled"):
        decided = ((body.get("status") or {}).get("autoscaling") or {}).get("replicas")
        if not isinstance(decided, int) or isinstance(decided, bool):
            return bounds.max_replicas
        return min(max(decided, bounds.min_replicas), bounds.max_replicas)
    return min(max(int(rollout.get("replicas", last)), bounds.min_replicas), bounds.max_replicas)


class _StatusReporter:
    """The controller pod's channel to its RLJob: status.progress (each step, and what it waits for),
    and the spec's rollout.replicas; in a cluster only (pods as processes print what they would say)."""

    def __init__(self, job: RLJob) -> None:
        self.job = job
        self.api: Any = None
        self.namespace = os.environ.get("RHYMERL_NAMESPACE") or job.metadata.namespace or "default"
        self._replicas = job.spec.rollout.replicas
        self._read_at = -SPEC_EVERY_S
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            from kubernetes import client, config

            config.load_incluster_config()
            self.api = client.ApiClient()

    def say(self, message: str) -> None:
        print(f"controller: {message}", flush=True)
        if self.api is not None:
            from rhymerl.operator.progress import report_message

            self._send(lambda: report_message(self.api, self.namespace, self.job.metadata.name, message))

    def pods_in_use(self, pods: int | None) -> None:
        """status.progress.rolloutPodsInUse: how many leading rollout pod ordinals hold the fleet's workers."""
        if self.api is not None:
            from rhymerl.operator.progress import report_pods_in_use

            self._send(lambda: report_pods_in_use(self.api, self.namespace, self.job.metadata.name, pods))

    def progress(self, row: Mapping[str, Any], finished: bool) -> None:
        if self.api is not None:
            from rhymerl.operator.progress import report

            self._send(lambda: report(self.api, self.namespace, self.job.metadata.name, row, finished))

    def wanted(self) -> Callable[[], int] | None:
        """The RLJob's spec.rollout.replicas, read again every SPEC_EVERY_S (None outside a cluster); with
        spec.rollout.autoscaling on, max_replicas: the fleet follows the pods there are."""
        if self.api is None:
            return None
        return self._spec_replicas

    def _spec_replicas(self) -> int:
        now = time.monotonic()
        if now - self._read_at >= SPEC_EVERY_S:
            self._read_at = now
            from kubernetes.client import CustomObjectsApi

            from rhymerl.api.crd import PLURAL
            from rhymerl.api.spec import GROUP, VERSION

            try:
                body: Any = CustomObjectsApi(self.api).get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, self.job.metadata.name)
                self._replicas = wanted_rollout(body, self.job, self._replicas)
            except Exception as exc:  # the last value holds: a read that fails never stops the run
                print(f"controller: could not read spec.rollout.replicas ({type(exc).__name__}: {exc})",
                      file=sys.stderr, flush=True)
        return self._replicas

    @staticmethod
    def _send(write: Callable[[], object]) -> None:
        try:
            write()
        except Exception as exc:  # progress is informative: a failed patch never stops the run
            print(f"controller: could not report progress ({type(exc).__name__}: {exc})", file=sys.stderr,
                  flush=True)
