"""RLJob -> the Kubernetes objects that run it: pure functions, the same answer for the same job.

`desired(job, owner)` lists every child in a fixed order (ConfigMap, RBAC, Services, StatefulSets,
PodDisruptionBudgets; roles in ROLES order), each with the job's namespace, the app.kubernetes.io
labels and, given an owner, an ownerReference, so that deleting the RLJob deletes them all. The
operator converges the cluster to this list; `rhymerl render` prints it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import yaml

from rhymerl.api.crd import PLURAL
from rhymerl.api.history_keys import REDIS_PASSWORD_ENV
from rhymerl.api.load import dump_job
from rhymerl.api.roles import ROLES, Role
from rhymerl.api.spec import (
    GROUP,
    Placement,
    Resources,
    RLJob,
    RLJobSpec,
    RolloutSpec,
    Toleration,
)
from rhymerl.operator.manifests.labels import labels, selector
from rhymerl.operator.manifests.roles import (
    DATA_DIR,
    FIELD_ENV,
    HEALTH_PATH,
    READY_PATH,
    RUNTIME,
    SCRATCH_DIR,
    SPEC_DIR,
    SPEC_FILE,
    argv,
    child_name,
    environment,
)

Manifest = dict[str, Any]

SPEC_HASH_ANNOTATION = "rhymerl.io/spec-hash"
GPU_RESOURCE = "nvidia.com/gpu"
RUN_AS = 10001  # the images' non-root user (images/Dockerfile.*)
DEFAULT_NAMESPACE = "default"
# Fields the operator applies without restarting pods: scaling, suspend, the crash budget.
_NOT_HASHED: dict[str, Any] = {"suspend": True, "failure_policy": True,
                               "rollout": {"replicas", "min_replicas", "max_replicas"}}
_DISRUPTABLE: tuple[Role, ...] = ("rollout", "reward", "history")  # may lose a pod at a time
# kind -> (API group, resource) of every kind `desired` returns: for API calls and RBAC rules.
RESOURCES: dict[str, tuple[str, str]] = {
    "ConfigMap": ("", "configmaps"),
    "ServiceAccount": ("", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
    "Service": ("", "services"),
    "StatefulSet": ("apps", "statefulsets"),
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
}


@dataclass(frozen=True)
class Owner:
    """The RLJob object as Kubernetes knows it, for ownerReferences."""

    api_version: str
    kind: str
    name: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}


def namespace_of(job: RLJob) -> str:
    return job.metadata.namespace or DEFAULT_NAMESPACE


def spec_yaml(job: RLJob) -> str:
    """The resolved job as the pods read it (every default spelled out)."""
    return dump_job(job)


def spec_hash(job: RLJob) -> str:
    """16 hex digits of the resolved spec, leaving out what the operator applies without restarting pods
    (replica counts, suspend, failure_policy): a change of anything else changes the pod templates."""
    rolled = job.spec.model_dump(mode="json", exclude=_NOT_HASHED)
    text = json.dumps(rolled, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def rollout_replicas(rollout: RolloutSpec) -> int:
    """spec.rollout.replicas within [min_replicas, max_replicas]. The CRD's rules and the spec's validator
    refuse a job outside them; this keeps the pod count in bounds even for one that got past both."""
    return max(rollout.min_replicas, min(rollout.replicas, rollout.max_replicas))


def replicas(job: RLJob, role: Role) -> int:
    """Pods wanted for `role`: zero for every role of a suspended job, and for reward pods when the
    built-in verifier (run in the controller) scores the samples."""
    spec = job.spec
    if spec.suspend:
        return 0
    wanted = {
        "controller": 1,
        "rollout": rollout_replicas(spec.rollout),
        "train": spec.train.replicas,
        "reward": spec.reward.replicas if spec.reward.function is not None else 0,
        "history": spec.history.replicas,
    }
    return wanted[role]


def _most_replicas(spec: RLJobSpec, role: Role) -> int:
    if role == "rollout":
        return spec.rollout.max_replicas
    if role == "reward":
        return spec.reward.replicas if spec.reward.function is not None else 0
    if role == "history":
        return spec.history.replicas
    return 1 if role == "controller" else spec.train.replicas


def _block(spec: RLJobSpec, role: Role) -> tuple[Placement, Resources]:
    blocks: dict[Role, tuple[Placement, Resources]] = {
        "controller": (spec.controller, spec.controller.resources),
        "rollout": (spec.rollout, spec.rollout.resources),
        "train": (spec.train, spec.train.resources),
        "reward": (spec.reward, spec.reward.resources),
        "history": (spec.history, spec.history.resources),
    }
    return blocks[role]


def _metadata(job: RLJob, name: str, owner: Owner | None, role: Role | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace_of(job), "labels": labels(job.metadata.name, role)}
    if owner is not None:
        meta["ownerReferences"] = [owner.reference()]
    return meta


def _toleration(t: Toleration) -> dict[str, Any]:
    out: dict[str, Any] = {"operator": t.operator}
    if t.key is not None:
        out["key"] = t.key
    if t.value is not None:
        out["value"] = t.value
    if t.effect is not None:
        out["effect"] = t.effect
    if t.toleration_seconds is not None:
        out["tolerationSeconds"] = t.toleration_seconds
    return out


def _resources(resources: Resources) -> dict[str, Any]:
    requests = {"cpu": str(resources.cpu), "memory": str(resources.memory)}
    limits = {"memory": str(resources.memory)}
    if resources.gpu:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(resources.gpu)
    return {"requests": requests, "limits": limits}


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


def _env(job: RLJob, role: Role) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in environment(job.metadata.name, role).items()]
    env += [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": path}}} for k, path in FIELD_ENV.items()]
    secret = job.spec.history.redis_password_secret
    if secret is not None and RUNTIME[role].history_client:
        env.append({"name": REDIS_PASSWORD_ENV,
                    "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}})
    return env


def _container(job: RLJob, role: Role, resources: Resources) -> dict[str, Any]:
    runtime = RUNTIME[role]
    command = argv(role)

    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "timeoutSeconds": 5,
                "failureThreshold": failures}

    mounts = [{"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
              {"name": "scratch", "mountPath": SCRATCH_DIR},
              {"name": "data", "mountPath": DATA_DIR}]
    if resources.gpu:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return {
        "name": role,
        "image": getattr(job.spec.images, role),
        "imagePullPolicy": job.spec.images.pull_policy,
        "command": command[:1],
        "args": command[1:],
        "env": _env(job, role),
        "ports": [{"name": p.name, "containerPort": p.port, "protocol": "TCP"} for p in runtime.ports],
        "resources": _resources(resources),
        "volumeMounts": mounts,
        "startupProbe": probe(HEALTH_PATH, 10, max(1, runtime.startup_s // 10)),
        "livenessProbe": probe(HEALTH_PATH, 10, 3),
        "readinessProbe": probe(READY_PATH, 5, 3),
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }


def _pod_template(job: RLJob, role: Role, digest: str) -> dict[str, Any]:
    name = job.metadata.name
    block, resources = _block(job.spec, role)
    runtime = RUNTIME[role]
    volumes: list[dict[str, Any]] = [
        {"name": "spec", "configMap": {"name": child_name(name, "spec")}},
        {"name": "scratch", "emptyDir": {}},
    ]
    if not runtime.stateful:
        volumes.append({"name": "data", "emptyDir": {}})
    if resources.gpu:  # NCCL and vLLM's workers share memory through /dev/shm
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    pod: dict[str, Any] = {
        "automountServiceAccountToken": runtime.kube_api,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(job, role, resources)],
        "volumes": volumes,
        "terminationGracePeriodSeconds": runtime.stop_grace_s,
    }
    if runtime.kube_api:
        pod["serviceAccountName"] = child_name(name, "controller")
    if job.spec.images.pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in job.spec.images.pull_secrets]
    pod.update(_placement(job, role, block))
    return {"metadata": {"labels": labels(name, role), "annotations": {SPEC_HASH_ANNOTATION: digest}}, "spec": pod}


def _config_map(job: RLJob, owner: Owner | None) -> Manifest:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _metadata(job, child_name(job.metadata.name, "spec"), owner),
            "data": {SPEC_FILE: spec_yaml(job)}}


def _controller_rbac(job: RLJob, owner: Owner | None) -> list[Manifest]:
    """The controller pod's identity: it may read its own RLJob and patch that job's status (it writes
    status.progress), nothing else."""
    job_name = job.metadata.name
    name = child_name(job_name, "controller")
    own = [job_name]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(job, name, owner, "controller")},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": _metadata(job, name, owner, "controller"),
         "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": own, "verbs": ["get"]},
                   {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "resourceNames": own,
                    "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _metadata(job, name, owner, "controller"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace_of(job)}]},
    ]


def _service(job: RLJob, role: Role, owner: Owner | None) -> Manifest:
    """Headless: stable per-pod DNS names (`<job>-<role>-N.<job>-<role>`), published before pods are
    ready so that Ray peers find each other while starting."""
    name = child_name(job.metadata.name, role)
    ports = [{"name": p.name, "port": p.port, "targetPort": p.name, "protocol": "TCP"} for p in RUNTIME[role].ports]
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(job, name, owner, role),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": selector(job.metadata.name, role), "ports": ports}}


def _stateful_set(job: RLJob, role: Role, owner: Owner | None, digest: str) -> Manifest:
    name = child_name(job.metadata.name, role)
    spec: dict[str, Any] = {
        "serviceName": name,
        "replicas": replicas(job, role),
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": selector(job.metadata.name, role)},
        "updateStrategy": {"type": "RollingUpdate"},
        "template": _pod_template(job, role, digest),
    }
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
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _metadata(job, name, owner, role),
            "spec": spec}


def _disruption_budget(job: RLJob, role: Role, owner: Owner | None) -> Manifest:
    """At most one pod of the role evicted at a time (drains, upgrades); crash-looping pods may always be
    evicted, so a broken pod never blocks a node drain."""
    name = child_name(job.metadata.name, role)
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _metadata(job, name, owner, role),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(job.metadata.name, role)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


def desired(job: RLJob, owner: Owner | None) -> list[Manifest]:
    """Every child of `job`, in a fixed order. Without an owner (a dry run) there are no ownerReferences.

    PodDisruptionBudgets exist for the roles that can lose one pod at a time and may have two or more
    (rollout up to max_replicas, reward, history); the controller and train pods are single or in
    lockstep, where a budget would only block node drains (their progress is in checkpoints)."""
    digest = spec_hash(job)
    objects = [_config_map(job, owner), *_controller_rbac(job, owner)]
    objects += [_service(job, role, owner) for role in ROLES]
    objects += [_stateful_set(job, role, owner, digest) for role in ROLES]
    objects += [_disruption_budget(job, role, owner) for role in _DISRUPTABLE
                if _most_replicas(job.spec, role) >= 2]
    return objects


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap's spec.yaml) as literal blocks, readable in a diff."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def to_yaml(objects: list[Manifest]) -> str:
    """A multi-document YAML stream of `objects`, as `kubectl apply -f -` reads it."""
    return yaml.dump_all(objects, Dumper=_BlockDumper, sort_keys=False, explicit_start=True, width=120)
