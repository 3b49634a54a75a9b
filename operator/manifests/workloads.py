"""A role's StatefulSet (with its checkpoint claims on stateful roles) and PodDisruptionBudget."""

from __future__ import annotations

from typing import Any

from rhymerl.api.roles import Role
from rhymerl.api.spec import RLJob
from rhymerl.operator.manifests.labels import labels, selector
from rhymerl.operator.manifests.objects import Manifest, Owner, child_metadata
from rhymerl.operator.manifests.pods import pod_template
from rhymerl.operator.manifests.replicas import replicas
from rhymerl.operator.manifests.roles import RUNTIME, child_name, identity_env


def stateful_set(job: RLJob, role: Role, owner: Owner | None, digest: str) -> Manifest:
    name = child_name(job.metadata.name, role)
    spec: dict[str, Any] = {
        "serviceName": name,
        "replicas": replicas(job, role),
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": selector(job.metadata.name, role)},
        "updateStrategy": {"type": "RollingUpdate"},
        "template": pod_template(job, role, digest),
    }
    if owner is not None:  # one job, one identity: its pods' run folders record its uid
        container = spec["template"]["spec"]["containers"][0]
        container["env"] = [*container["env"], *identity_env(owner.uid, job.metadata.annotations)]
    if RUNTIME[role].stateful:
        storage = job.spec.checkpoint.storage
        claim: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                 "resources": {"requests": {"storage": str(storage.size)}}}
        if storage.storage_class is not None:
            claim["storageClassName"] = storage.storage_class
        spec["volumeClaimTemplates"] = [{"metadata": {"name": "data", "labels": labels(job.metadata.name, role)},
                                         "spec": claim}]
        spec["persistentVolumeClaimRetentionPolicy"] = {
            "whenDeleted": "Retain" if storage.keep_on_delete else "Delete", "whenScaled": "Retain"}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": child_metadata(job, name, owner, role),
            "spec": spec}


def disruption_budget(job: RLJob, role: Role, owner: Owner | None) -> Manifest:
    """At most one pod of the role evicted at a time (drains, upgrades); crash-looping pods may always be
    evicted, so a broken pod never blocks a node drain."""
    name = child_name(job.metadata.name, role)
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": child_metadata(job, name, owner, role),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(job.metadata.name, role)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}
