"""The controller pod's one write to Kubernetes: its job's headline progress, into status.progress.

The narrow channel: the controller pod runs as ServiceAccount `<job>-controller`, whose Role (rendered
by rhymerl.operator.manifests) may get its own RLJob and patch that RLJob's status subresource, nothing
else. `report` patches status.progress only (a JSON merge patch of the status subresource touches no
other field), and the operator never writes status.progress, so the two writers never overwrite each
other. The values come from the step loop's metrics row (docs/formats.md, `metrics.jsonl`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rhymerl.api.crd import PLURAL
from rhymerl.api.spec import GROUP, VERSION
from rhymerl.api.status import Progress

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

# metrics.jsonl key -> status.progress field
_FIELDS = {"step": "step", "epoch": "epoch", "policy_version": "policyVersion", "reward_mean": "rewardMean",
           "spec_acceptance": "acceptanceRate", "rollout_bubble": "bubbleRatio",
           "rollout_workers_live": "rolloutWorkers", "rollout_workers_wanted": "rolloutWorkersWanted",
           "fleet_recommended": "recommendedRolloutWorkers", "rollout_drafting_workers": "draftingRolloutWorkers"}
_COUNTS = ("step", "epoch", "policyVersion", "rolloutWorkers", "rolloutWorkersWanted", "recommendedRolloutWorkers",
           "draftingRolloutWorkers")
MESSAGE_MAX = 500
_TIMES = ("time_rollout_s", "time_reward_s", "time_train_s")


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def progress_of(row: Mapping[str, Any], now: datetime | None = None, finished: bool = False) -> dict[str, Any]:
    """status.progress from one metrics row; a value that is missing or not finite is left out."""
    out: dict[str, Any] = {}
    for key, name in _FIELDS.items():
        value = _number(row.get(key))
        if value is not None:
            out[name] = int(value) if name in _COUNTS else value
    times = [t for t in (_number(row.get(k)) for k in _TIMES) if t is not None]
    if times:
        out["lastStepSeconds"] = round(sum(times), 3)
    out["updatedAt"] = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out["finished"] = finished
    out["message"] = "finished" if finished else f"step {out.get('step', 0)} done"
    return Progress.model_validate(out).model_dump(mode="json", exclude_unset=True)


def report(api: ApiClient, namespace: str, name: str, row: Mapping[str, Any], finished: bool = False,
           now: datetime | None = None) -> dict[str, Any]:
    """Patch RLJob `namespace/name`'s status.progress from a metrics row (`finished`: the last step is
    done); `api` is a kubernetes.client.ApiClient (in the pod: config.load_incluster_config()).
    Returns the progress written."""
    from kubernetes.client import CustomObjectsApi

    progress = progress_of(row, now, finished)
    CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": {"progress": progress}},
        _content_type="application/merge-patch+json")
    return progress


def report_pods_in_use(api: ApiClient, namespace: str, name: str, pods: int | None,
                       now: datetime | None = None) -> None:
    """Patch only status.progress.rolloutPodsInUse (and updatedAt): the leading rollout pod ordinals that
    hold the fleet's workers, which the operator waits for before it lowers the rollout StatefulSet
    (operator/reconcile/drain.py); None removes it (a worker's pod is not known)."""
    from kubernetes.client import CustomObjectsApi

    patch = {"rolloutPodsInUse": pods, "updatedAt": (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": {"progress": patch}},
        _content_type="application/merge-patch+json")


def report_message(api: ApiClient, namespace: str, name: str, message: str, now: datetime | None = None) -> None:
    """Patch only status.progress.message (and updatedAt): what the controller is doing or waiting for
    ("waiting for pods to join: 1 train"), between its step reports."""
    from kubernetes.client import CustomObjectsApi

    patch = {"message": message[:MESSAGE_MAX],
             "updatedAt": (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": {"progress": patch}},
        _content_type="application/merge-patch+json")
