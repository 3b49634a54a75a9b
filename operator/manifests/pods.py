"""A role's pod template: its volumes, security context, identity, user overrides and placement on
nodes (selectors, tolerations, spot affinity, topology spread)."""

from __future__ import annotations

from typing import Any

from rhymerl.api.placement import Placement, Resources, Toleration
from rhymerl.api.roles import Role
from rhymerl.api.spec import RLJob
from rhymerl.operator.manifests.access import ray_token_name
from rhymerl.operator.manifests.containers import (
    fetch_container,
    model_cache_claim,
    object_store_bytes,
    role_block,
    role_fetches,
    source_claims,
    stop_grace_s,
    worker_container,
)
from rhymerl.operator.manifests.labels import labels, selector
from rhymerl.operator.manifests.replicas import kueue_pod_group
from rhymerl.operator.manifests.roles import RUNTIME, child_name
from rhymerl.operator.manifests.spec_config import SPEC_HASH_ANNOTATION
from rhymerl.operator.manifests.storage import (
    data_volume,
    fetched_size,
    model_cache_volume,
    with_disk_request,
)

RUN_AS = 10001  # the images' non-root user (images/Dockerfile.*)
SHM_SLACK_BYTES = 64 << 20  # beyond the object store: what else a CPU pod's processes put in /dev/shm
# The controller's and the train pods' loss restarts the run from its last checkpoint: node autoscalers
# must not move them to consolidate nodes (Cluster Autoscaler's and Karpenter's own annotations). Drains
# and upgrades still take them (a PodDisruptionBudget that forbade it would stall node upgrades; their
# loss is a preemption, not a crash: docs/operations.md "Disruptions").
_NOT_CONSOLIDATED = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false", "karpenter.sh/do-not-disrupt": "true"}


def _toleration(t: Toleration) -> dict[str, Any]:
    return t.model_dump(mode="json", by_alias=True, exclude_none=True)  # the spec's aliases are a Pod's names


def _placement(job: RLJob, role: Role, block: Placement) -> dict[str, Any]:
    """nodeSelector, tolerations, affinity and topology spread of one role's pods; spot options apply
    to rollout pods only."""
    out: dict[str, Any] = {}
    if block.node_selector:
        out["nodeSelector"] = dict(sorted(block.node_selector.items()))
    tolerations = [_toleration(t) for t in block.tolerations]
    spot = job.spec.rollout.spot
    if role == "rollout" and spot.enabled:
        tolerations += [_toleration(t) for t in spot.tolerations]
        if spot.node_selector:
            term = {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}
                                         for key, value in sorted(spot.node_selector.items())]}
            affinity = ({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
                        if spot.required else
                        {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": term}]})
            out["affinity"] = {"nodeAffinity": affinity}
    if tolerations:
        out["tolerations"] = tolerations
    spread = block.topology_spread
    if spread.enabled:
        out["topologySpreadConstraints"] = [{
            "maxSkew": spread.max_skew, "topologyKey": spread.topology_key,
            "whenUnsatisfiable": spread.when_unsatisfiable,
            "labelSelector": {"matchLabels": selector(job.metadata.name, role)},
        }]
    return out


def _shared_memory(resources: Resources) -> dict[str, Any]:
    """/dev/shm, in memory: every pod is a Ray node, whose object store lives there (a container's own is
    64 MiB, and Ray then puts the store on disk under /tmp, with a warning); counted in the pod's memory
    limit. On a GPU pod NCCL and vLLM's workers share it too, so it takes what it needs there."""
    limit = {} if resources.gpu else {"sizeLimit": str(object_store_bytes(resources) + SHM_SLACK_BYTES)}
    return {"name": "dshm", "emptyDir": {"medium": "Memory", **limit}}


def pod_template(job: RLJob, role: Role, digest: str) -> dict[str, Any]:
    name = job.metadata.name
    block, resources = role_block(job.spec, role)
    runtime = RUNTIME[role]
    volumes: list[dict[str, Any]] = [
        {"name": "spec", "configMap": {"name": child_name(name, "spec")}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "ray-token", "secret": {"secretName": ray_token_name(name), "defaultMode": 0o440}},
    ]
    cache_claim = model_cache_claim(job, role)
    fetched = None if runtime.stateful else fetched_size(role_fetches(job, role), resources, cache_claim is not None)
    if not runtime.stateful:
        volumes.append(data_volume(fetched))
    volumes.append(_shared_memory(resources))
    volumes += [{"name": f"fetch-source-{i}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
                for i, claim in enumerate(source_claims(role_fetches(job, role)))]
    volumes += [] if cache_claim is None else [model_cache_volume(cache_claim)]
    user = block.pod
    volumes += [v.model_dump(mode="json", exclude_none=True) for v in user.volumes]
    pod: dict[str, Any] = {
        "automountServiceAccountToken": runtime.kube_api,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [with_disk_request(worker_container(job, role, resources), fetched)],
        "volumes": volumes,
        "terminationGracePeriodSeconds": stop_grace_s(job, role),
    }
    if runtime.kube_api:
        pod["serviceAccountName"] = child_name(name, "controller")
    elif user.service_account_name is not None:  # the user's account, e.g. for cloud storage: its token too
        pod["serviceAccountName"] = user.service_account_name
        pod["automountServiceAccountToken"] = True
    fetch = fetch_container(job, role, resources)
    init = ([] if fetch is None else [fetch]) + [c.model_dump(mode="json", exclude_none=True)
                                                 for c in user.init_containers]
    if init:
        pod["initContainers"] = init
    if user.priority_class_name is not None:
        pod["priorityClassName"] = user.priority_class_name
    if user.scheduler_name is not None:
        pod["schedulerName"] = user.scheduler_name
    if job.spec.images.pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in job.spec.images.pull_secrets]
    pod.update(_placement(job, role, block))
    if user.affinity is not None:  # the spec refuses a nodeAffinity beside the spot options' own
        pod["affinity"] = {**pod.get("affinity", {}), **user.affinity.model_dump(mode="json", exclude_none=True)}
    group_labels, group_annotations = kueue_pod_group(job)
    kept = _NOT_CONSOLIDATED if role in ("controller", "train") else {}
    return {"metadata": {"labels": {**user.labels, **labels(name, role), **group_labels},
                         "annotations": {**kept, **user.annotations, SPEC_HASH_ANNOTATION: digest,
                                         **group_annotations}},
            "spec": pod}
