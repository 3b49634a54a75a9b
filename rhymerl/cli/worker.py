"""`rhymerl worker --role ROLE --spec FILE`: what one pod runs (the operator's pod templates name
this command, with the environment of rhymerl.operator.manifests.roles). The pod's life is the
runtime's (workers/runtime/pod_supervisor.py, controller_pod.py); what lives here is the controller
pod's channel to its RLJob in the cluster (status.progress, spec.rollout.replicas), which speaks the
operator's language.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rhymerl.api import RLJob
from rhymerl.api.load import load_job
from rhymerl.api.roles import ROLES
from rhymerl.errors import UserError
from rhymerl.workers.runtime.pod_supervisor import serve_pod

SPEC_EVERY_S = 10.0  # how often the controller reads its RLJob's spec.rollout.replicas


def serve(role_name: str, spec_path: Path) -> int:
    role = next((r for r in ROLES if r == role_name), None)
    if role is None:
        raise UserError(f"--role {role_name}: one of {', '.join(ROLES)}")
    return serve_pod(load_job(spec_path), role, _StatusReporter)


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
