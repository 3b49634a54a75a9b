"""`rhymerl worker --role ROLE --spec FILE`: what one pod runs (the operator's pod templates name
this command, with the environment of rhymerl.operator.manifests.roles).

The controller pod starts the Ray head, waits for every role's pods to join, then runs the job's
steps on their workers (workers/runtime/), resuming from its run folder when one is there (a
restarted controller pod). It reports each step to its RLJob's status.progress when it runs in a
cluster. Every other pod joins the head with its role and serves until the head goes away, then
exits non-zero so that the kubelet restarts it and it joins the next head. Every pod serves
/healthz, /readyz and /metrics on RHYMERL_HTTP_PORT.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry

from rhymerl.api import RLJob
from rhymerl.api.load import load_job
from rhymerl.api.roles import ROLES, Role
from rhymerl.errors import UserError
from rhymerl.workers.runtime import node
from rhymerl.workers.runtime.endpoints import Endpoints
from rhymerl.workers.runtime.worker_metrics import METRICS_DIR_ENV, ControllerMetrics

JOIN_TIMEOUT_S = 900.0  # pods of a job start in any order; a GPU pod may take minutes to pull its image


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
    registry = CollectorRegistry()
    endpoints = Endpoints(int(_env("RHYMERL_HTTP_PORT", "9090")), registry, metrics_dir)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if role == "controller":
            return _controller(job, registry, endpoints, scratch)
        return _member(job, role, endpoints, scratch)
    except _Stop:
        return 0
    finally:
        endpoints.close()


def _member(job: RLJob, role: Role, endpoints: Endpoints, scratch: Path) -> int:
    address = _env("RHYMERL_CONTROLLER")
    node.wait_reachable(address, JOIN_TIMEOUT_S)
    ray_node = node.join(address, role, scratch / "ray-node.log", _object_store_bytes())
    try:
        if _started(ray_node, scratch / "ray-node.log"):
            endpoints.ready.set()
            print(f"{role}: joined the Ray head at {address}", flush=True)
        code = ray_node.wait()
        print(f"{role}: the Ray node exited ({code}): the head went away; exiting so that the pod restarts and "
              "joins the next head", file=sys.stderr, flush=True)
        return 1
    finally:
        node.stop(ray_node)


def _started(ray_node: Any, log: Path, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and ray_node.poll() is None:
        if log.is_file() and "Ray runtime started" in log.read_text(errors="replace"):
            return True
        time.sleep(0.5)
    return False


def _object_store_bytes() -> int | None:
    value = os.environ.get("RHYMERL_OBJECT_STORE_BYTES")
    return int(value) if value else None


def _controller(job: RLJob, registry: CollectorRegistry, endpoints: Endpoints, scratch: Path) -> int:
    import torch

    from rhymerl.workers.controller.run_dir import RunDir
    from rhymerl.workers.controller.stopping import RunStopped
    from rhymerl.workers.runtime.actors import pod_run_dir
    from rhymerl.workers.runtime.ray_loop import run_steps_ray

    address = _env("RHYMERL_CONTROLLER")
    port = int(address.rpartition(":")[2])
    head_log = scratch / "ray-head.log"
    head = node.start_head(port, "controller", head_log, _object_store_bytes())
    try:
        node.connect(f"{os.environ.get('RHYMERL_POD_IP') or '127.0.0.1'}:{port}", JOIN_TIMEOUT_S, head, head_log)
        signal.signal(signal.SIGTERM, _on_sigterm)  # ray.init installed its own (which aborts)
        node.wait_for_roles(job, JOIN_TIMEOUT_S, say=lambda msg: print(f"controller: {msg}", flush=True))
        run = RunDir(pod_run_dir())
        resume = (run.path / "spec.yaml").is_file()
        if resume:
            saved = run.open()
            if saved.spec != job.spec:
                run.note("the job's spec changed since this run began; resuming with the spec it began with")
            job = saved
        else:
            run.create(job)
        metrics = ControllerMetrics(registry)
        progress = _progress_reporter(job)
        endpoints.ready.set()
        print(f"controller: {'resuming' if resume else 'running'} {job.metadata.name} in {run.path}", flush=True)
        last: Mapping[str, Any] | None = None
        try:
            for row in run_steps_ray(job, run, resume, torch.get_num_threads()):
                metrics.update(row, 0)
                last = row.row()
                print(f"controller: step {row.step} epoch {row.epoch} reward {row.reward_mean:.4f} "
                      f"time {row.time_step_s}s lag {row.policy_lag_max}", flush=True)
                progress(last, False)
        except RunStopped as stopped:  # evicted or preempted: the step ran to its end and was checkpointed
            print(f"controller: {stopped}; the restarted pod resumes from it", flush=True)
            return 0
        finally:
            run.close()
        rows = run.metrics()
        if rows:
            progress(rows[-1], True)
        print(f"controller: {job.metadata.name} finished ({len(rows)} steps); idle until stopped", flush=True)
        threading.Event().wait()
        return 0
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        node.stop(head)


def _progress_reporter(job: RLJob) -> Any:
    """status.progress of the job's RLJob, in a cluster; nothing elsewhere (pods as processes)."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return lambda row, finished: None
    from kubernetes import client, config

    from rhymerl.operator.progress import report

    config.load_incluster_config()
    api = client.ApiClient()
    namespace = os.environ.get("RHYMERL_NAMESPACE") or job.metadata.namespace or "default"

    def send(row: Mapping[str, Any], finished: bool) -> None:
        try:
            report(api, namespace, job.metadata.name, row, finished)
        except Exception as exc:  # progress is informative: a failed patch never stops the run
            print(f"controller: could not report progress ({type(exc).__name__}: {exc})", file=sys.stderr,
                  flush=True)

    return send
