"""RLJob -> the Kubernetes objects that run it: pure functions, the same answer for the same job.

`desired(job, owner)` lists every child in a fixed order (ConfigMap, RBAC, Services, StatefulSets,
PodDisruptionBudgets, NetworkPolicies; roles in ROLES order), each with the job's namespace, the
app.kubernetes.io labels and, given an owner, an ownerReference, so that deleting the RLJob deletes
them all. The operator converges the cluster to this list; `rhymerl render` prints it. The job's Ray
token Secret (`ray_token_secret`) is apart: the operator creates it once, never converges it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import yaml

from rhymerl.api.crd import PLURAL
from rhymerl.api.history_keys import REDIS_PASSWORD_ENV
from rhymerl.api.k8s_values import quantity_value
from rhymerl.api.load import dump_job
from rhymerl.api.roles import CPU_REQUEST_ENV, ROLES, Role
from rhymerl.api.sources import (
    CACHE_ROOT,
    PVC_ROOT,
    Fetches,
    cached_model,
    fetched_data,
    fetched_model,
    fetches,
)
from rhymerl.api.spec import (
    GPU_RESOURCE,
    GROUP,
    WORKER_CPU_IMAGE,
    WORKER_GPU_IMAGE,
    Placement,
    Resources,
    RLJob,
    RLJobSpec,
    RolloutSpec,
    Toleration,
)
from rhymerl.operator.manifests.labels import (
    COMPONENT_KEY,
    KUEUE_GROUP_LABEL,
    KUEUE_QUEUE_LABEL,
    KUEUE_TOTAL_ANNOTATION,
    job_selector,
    labels,
    selector,
)
from rhymerl.operator.manifests.roles import (
    DATA_DIR,
    FETCH_CONTAINER,
    FETCH_DIR,
    FIELD_ENV,
    GRACE_ENV,
    HEALTH_PATH,
    HTTP_PORT,
    RAY_GCS_PORT,
    READS_MODEL,
    READY_PATH,
    RUNTIME,
    SCRATCH_DIR,
    SPEC_DIR,
    SPEC_FILE,
    argv,
    child_name,
    environment,
    fetch_argv,
    identity_env,
)
from rhymerl.operator.manifests.storage import (
    data_volume,
    fetched_size,
    model_cache_mount,
    model_cache_volume,
    with_disk_request,
)
from rhymerl.workers.runtime.ray_network import (
    OBJECT_STORE_ENV,
    OBJECT_STORE_SHARE,
    POD_PORTS,
    TOKEN_DIR,
    TOKEN_KEY,
)

Manifest = dict[str, Any]

SPEC_HASH_ANNOTATION = "rhymerl.io/spec-hash"
RUN_AS = 10001  # the images' non-root user (images/Dockerfile.*)
SHM_DIR = "/dev/shm"
SHM_SLACK_BYTES = 64 << 20  # beyond the object store: what else a CPU pod's processes put in /dev/shm
DEFAULT_NAMESPACE = "default"
# Fields the operator applies without restarting pods: scaling, suspend, the crash budget.
_NOT_HASHED: dict[str, Any] = {"suspend": True, "failure_policy": True, "active_deadline_seconds": True,
                               "ttl_seconds_after_finished": True,
                               "rollout": {"replicas", "min_replicas", "max_replicas", "autoscaling"}}
_DISRUPTABLE: tuple[Role, ...] = ("rollout", "reward", "history")  # may lose a pod at a time
# The controller's and the train pods' loss restarts the run from its last checkpoint: node autoscalers
# must not move them to consolidate nodes (Cluster Autoscaler's and Karpenter's own annotations). Drains
# and upgrades still take them (a PodDisruptionBudget that forbade it would stall node upgrades; their
# loss is a preemption, not a crash: docs/operations.md "Disruptions").
_NOT_CONSOLIDATED = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false", "karpenter.sh/do-not-disrupt": "true"}
# kind -> (API group, resource) of every kind `desired` returns: for API calls and RBAC rules.
RESOURCES: dict[str, tuple[str, str]] = {
    "ConfigMap": ("", "configmaps"),
    "ServiceAccount": ("", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
    "Service": ("", "services"),
    "StatefulSet": ("apps", "statefulsets"),
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
    "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
}
# Roles whose pods talk torch.distributed to each other (train ranks; weight broadcasts from train to
# rollout), over ports chosen at random: the one traffic inside a job that cannot name its ports.
_COLLECTIVES: tuple[Role, ...] = ("rollout", "train")


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


SPEC_YAML_KEPT = 4096  # jobs whose spec.yaml is remembered (the operator renders every job at every resync)
_spec_yamls: dict[str, str] = {}  # the localized job as JSON -> its spec.yaml


def spec_yaml(job: RLJob) -> str:
    """The resolved job as the pods read it (every default spelled out), with a fetched model or data
    source replaced by where the pods' fetch step puts it (`_fetch_container`). Remembered per job: the
    YAML dump is most of a reconcile pass's CPU (about 10 ms of 20), and the operator renders every job it
    serves at every resync, where its JSON (a key 400 times cheaper to make) rarely changes."""
    resolved = localized(job)
    key = resolved.model_dump_json()
    found = _spec_yamls.get(key)
    if found is None:
        found = _spec_yamls[key] = dump_job(resolved)
        if len(_spec_yamls) > SPEC_YAML_KEPT:
            del _spec_yamls[next(iter(_spec_yamls))]  # the oldest
    return found


def localized(job: RLJob) -> RLJob:
    """`job` with model.path and data.source naming the fetched copies under FETCH_DIR (the model: on the
    cache claim, with a cache), if fetched."""
    wanted = fetches(job.spec.model.path, job.spec.data.source)
    if not wanted.any:
        return job
    cache = job.spec.model.cache
    path = fetched_model(FETCH_DIR) if wanted.model is None or cache is None else cached_model(CACHE_ROOT, wanted.model)
    model = job.spec.model if wanted.model is None else job.spec.model.model_copy(update={"path": path, "cache": None})
    data = job.spec.data if wanted.data is None else job.spec.data.model_copy(
        update={"source": fetched_data(FETCH_DIR, wanted.data)})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"model": model, "data": data})})


def spec_hash(job: RLJob) -> str:
    """16 hex digits of what the user's spec sets to other than its default (and the job's Kueue queue),
    leaving out what the operator applies without restarting pods (replica counts, suspend,
    failure_policy, the deadline and TTL). A release that adds a field, or changes how the builders render a
    pod, does not move it; one that changes a default does, for jobs the API server stored the old default
    in, so pinning (diff.pinned) compares a job's recorded spec with its current one under one release."""
    rolled = job.spec.model_dump(mode="json", exclude=_NOT_HASHED, exclude_defaults=True)
    queue = job.metadata.labels.get(KUEUE_QUEUE_LABEL)
    text = json.dumps(rolled if queue is None else {"spec": rolled, "queue": queue}, sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stop_grace_s(job: RLJob, role: Role) -> int:
    """SIGTERM to SIGKILL of the role's pods: the controller's (a step and its checkpoint) and a rollout
    pod's (its workers hand their samples back) from the spec."""
    if role == "controller":
        return job.spec.controller.termination_grace_seconds
    if role == "rollout":
        return job.spec.rollout.termination_grace_seconds
    return RUNTIME[role].stop_grace_s


def kueue_pod_group(job: RLJob) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations that make every pod of a job labelled kueue.x-k8s.io/queue-name one Kueue pod
    group, admitted whole (docs/operations.md, "Kueue"); nothing for any other job. The group's size is
    every role's pods at the job's one size (a queued job's rollout.min_replicas equals max_replicas)."""
    queue = job.metadata.labels.get(KUEUE_QUEUE_LABEL)
    if queue is None:
        return {}, {}
    total = sum(replicas(job.model_copy(update={"spec": job.spec.model_copy(update={"suspend": False})}), role)
                for role in ROLES)
    return ({KUEUE_QUEUE_LABEL: queue, KUEUE_GROUP_LABEL: job.metadata.name},
            {KUEUE_TOTAL_ANNOTATION: str(total)})


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
    return t.model_dump(mode="json", by_alias=True, exclude_none=True)  # the spec's aliases are a Pod's names


def _resources(resources: Resources) -> dict[str, Any]:
    requests = {"cpu": str(resources.cpu), "memory": str(resources.memory)}
    limits = {"memory": str(resources.memory)}
    if resources.gpu:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(resources.gpu)
    for key, amount in sorted(resources.extra.items()):  # extended resources: requests equal limits
        requests[key] = limits[key] = str(amount)
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


def object_store_bytes(resources: Resources) -> int:
    """The Ray object store of a pod with these resources: Ray's own default share of its memory
    (OBJECT_STORE_SHARE), set explicitly because the pod's /dev/shm is sized to hold it."""
    return int(float(quantity_value(resources.memory)) * OBJECT_STORE_SHARE)


def _shared_memory(resources: Resources) -> dict[str, Any]:
    """/dev/shm, in memory: every pod is a Ray node, whose object store lives there (a container's own is
    64 MiB, and Ray then puts the store on disk under /tmp, with a warning); counted in the pod's memory
    limit. On a GPU pod NCCL and vLLM's workers share it too, so it takes what it needs there."""
    limit = {} if resources.gpu else {"sizeLimit": str(object_store_bytes(resources) + SHM_SLACK_BYTES)}
    return {"name": "dshm", "emptyDir": {"medium": "Memory", **limit}}


def _env(job: RLJob, role: Role) -> list[dict[str, Any]]:
    named = {**environment(job.metadata.name, role), GRACE_ENV: str(stop_grace_s(job, role)),
             OBJECT_STORE_ENV: str(object_store_bytes(_block(job.spec, role)[1]))}
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in named.items()]
    env += [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": path}}} for k, path in FIELD_ENV.items()]
    env.append({"name": CPU_REQUEST_ENV,  # the workers' threads where the pod has no CPU limit (roles/threads.py)
                "valueFrom": {"resourceFieldRef": {"containerName": role, "resource": "requests.cpu", "divisor": "1"}}})
    secret = job.spec.history.redis_password_secret
    if secret is not None and RUNTIME[role].history_client:
        env.append({"name": REDIS_PASSWORD_ENV,
                    "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}})
    return env + _user_env(job, role)


def _user_env(job: RLJob, role: Role) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json", exclude_none=True) for e in _block(job.spec, role)[0].pod.env]


def _user_env_from(job: RLJob, role: Role) -> dict[str, Any]:
    env_from = _block(job.spec, role)[0].pod.env_from
    return {"envFrom": [e.model_dump(mode="json", exclude_none=True) for e in env_from]} if env_from else {}


def _user_mounts(job: RLJob, role: Role) -> list[dict[str, Any]]:
    return [m.model_dump(mode="json", exclude_none=True) for m in _block(job.spec, role)[0].pod.volume_mounts]


def _role_fetches(job: RLJob, role: Role) -> Fetches:
    wanted = fetches(job.spec.model.path, job.spec.data.source)
    return Fetches(wanted.model if role in READS_MODEL else None, wanted.data)


def _cache_claim(job: RLJob, role: Role) -> str | None:
    """The model cache claim a pod of `role` mounts: where the job has one and the role reads the model."""
    cache = job.spec.model.cache
    return None if cache is None or _role_fetches(job, role).model is None else cache.claim


def _source_claims(wanted: Fetches) -> list[str]:
    """The claims of pvc:// sources; the i-th is volume `fetch-source-<i>` (reserved: api/pod.py)."""
    return sorted({s.where for s in (wanted.model, wanted.data) if s is not None and s.scheme == "pvc"})


def _fetch_container(job: RLJob, role: Role, resources: Resources) -> dict[str, Any] | None:
    """The pod's fetch step: `rhymerl fetch` in the role's image, writing the model and data sources
    that are not paths into the pod's data volume (FETCH_DIR), where the resolved spec points the role
    (`localized`), the model onto the cache claim with spec.model.cache (read-write here, read-only in the
    role); a pvc:// source's claim is mounted read-only here only. It skips what a marker says
    is already there (a restarted pod on its volume claim). The role's env, envFrom and mounts apply,
    so credentials and endpoints (AWS_*, HF_TOKEN) reach it as they reach the role."""
    wanted = _role_fetches(job, role)
    if not wanted.any:
        return None
    mounts: list[dict[str, Any]] = [{"name": "scratch", "mountPath": SCRATCH_DIR},
                                    {"name": "data", "mountPath": DATA_DIR}]
    mounts += [{"name": f"fetch-source-{i}", "mountPath": f"{PVC_ROOT}/{claim}", "readOnly": True}
               for i, claim in enumerate(_source_claims(wanted))]
    cached = _cache_claim(job, role) is not None
    mounts += [model_cache_mount(read_only=False)] if cached else []
    command = fetch_argv(None if wanted.model is None else wanted.model.text,
                         None if wanted.data is None else wanted.data.text, CACHE_ROOT if cached else None)
    plain = Resources(cpu=resources.cpu, memory=resources.memory)  # no GPU, no extended resources
    return {"name": FETCH_CONTAINER, "image": image(job, role), "imagePullPolicy": job.spec.images.pull_policy,
            "command": command[:1], "args": command[1:],
            "env": [{"name": "HOME", "value": SCRATCH_DIR}, *_user_env(job, role)], **_user_env_from(job, role),
            "resources": _resources(plain), "volumeMounts": mounts + _user_mounts(job, role),
            "securityContext": _hardened()}


def _hardened() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]}}


def image(job: RLJob, role: Role) -> str:
    """The role's image: spec.images.<role>, or for rollout and train left unset, the GPU image of the
    family when the role needs CUDA or vLLM and the CPU image otherwise (a CPU-only job pulls no CUDA)."""
    chosen: str | None = getattr(job.spec.images, role)
    if chosen is not None:
        return chosen
    spec = job.spec
    gpu = _block(spec, role)[1].gpu > 0 or (role == "rollout" and spec.rollout.engine == "vllm")
    return WORKER_GPU_IMAGE if gpu else WORKER_CPU_IMAGE


def _container(job: RLJob, role: Role, resources: Resources) -> dict[str, Any]:
    runtime = RUNTIME[role]
    command = argv(role)

    def probe(path: str, period: int, failures: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "timeoutSeconds": 5,
                "failureThreshold": failures}

    mounts = [{"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
              {"name": "scratch", "mountPath": SCRATCH_DIR},
              {"name": "data", "mountPath": DATA_DIR},
              {"name": "ray-token", "mountPath": TOKEN_DIR, "readOnly": True}]
    mounts.append({"name": "dshm", "mountPath": SHM_DIR})
    mounts += [model_cache_mount(read_only=True)] if _cache_claim(job, role) is not None else []
    mounts += _user_mounts(job, role)
    return {
        "name": role,
        "image": image(job, role),
        "imagePullPolicy": job.spec.images.pull_policy,
        "command": command[:1],
        "args": command[1:],
        "env": _env(job, role),
        **_user_env_from(job, role),
        "ports": [{"name": p.name, "containerPort": p.port, "protocol": "TCP"} for p in runtime.ports],
        "resources": _resources(resources),
        "volumeMounts": mounts,
        "startupProbe": probe(HEALTH_PATH, 10, max(1, runtime.startup_s // 10)),
        "livenessProbe": probe(HEALTH_PATH, 10, 3),
        "readinessProbe": probe(READY_PATH, 5, 3),
        "securityContext": _hardened(),
    }


def _pod_template(job: RLJob, role: Role, digest: str) -> dict[str, Any]:
    name = job.metadata.name
    block, resources = _block(job.spec, role)
    runtime = RUNTIME[role]
    volumes: list[dict[str, Any]] = [
        {"name": "spec", "configMap": {"name": child_name(name, "spec")}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "ray-token", "secret": {"secretName": ray_token_name(name), "defaultMode": 0o440}},
    ]
    cache_claim = _cache_claim(job, role)
    fetched = None if runtime.stateful else fetched_size(_role_fetches(job, role), resources, cache_claim is not None)
    if not runtime.stateful:
        volumes.append(data_volume(fetched))
    volumes.append(_shared_memory(resources))
    volumes += [{"name": f"fetch-source-{i}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
                for i, claim in enumerate(_source_claims(_role_fetches(job, role)))]
    volumes += [] if cache_claim is None else [model_cache_volume(cache_claim)]
    user = block.pod
    volumes += [v.model_dump(mode="json", exclude_none=True) for v in user.volumes]
    pod: dict[str, Any] = {
        "automountServiceAccountToken": runtime.kube_api,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [with_disk_request(_container(job, role, resources), fetched)],
        "volumes": volumes,
        "terminationGracePeriodSeconds": stop_grace_s(job, role),
    }
    if runtime.kube_api:
        pod["serviceAccountName"] = child_name(name, "controller")
    elif user.service_account_name is not None:  # the user's account, e.g. for cloud storage: its token too
        pod["serviceAccountName"] = user.service_account_name
        pod["automountServiceAccountToken"] = True
    fetch = _fetch_container(job, role, resources)
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


def _config_map(job: RLJob, owner: Owner | None) -> Manifest:
    meta = _metadata(job, child_name(job.metadata.name, "spec"), owner)
    out = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {SPEC_FILE: spec_yaml(job)}}
    meta["annotations"] = {SPEC_HASH_ANNOTATION: spec_hash(job)}  # diff.pinned: the spec the pods started with
    return out


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
         "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": [*own], "verbs": ["get"]},
                   {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "resourceNames": [*own],
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
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _metadata(job, name, owner, role),
            "spec": spec}


def _disruption_budget(job: RLJob, role: Role, owner: Owner | None) -> Manifest:
    """At most one pod of the role evicted at a time (drains, upgrades); crash-looping pods may always be
    evicted, so a broken pod never blocks a node drain."""
    name = child_name(job.metadata.name, role)
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _metadata(job, name, owner, role),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(job.metadata.name, role)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


def ray_token_name(job_name: str) -> str:
    return child_name(job_name, "ray-token")


def ray_token_secret(job: RLJob, owner: Owner | None, token: str) -> Manifest:
    """The job's Ray token, which every pod mounts (roles.environment points Ray at it). Not in
    `desired`: the operator creates it once and never rewrites it (a new token each pass would lock
    out the running pods), so it is immutable; it goes with the RLJob through its ownerReference."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _metadata(job, ray_token_name(job.metadata.name), owner),
            "type": "Opaque", "immutable": True, "stringData": {TOKEN_KEY: token}}


def ray_ports() -> list[dict[str, Any]]:
    """NetworkPolicy ports of every port a pod's Ray opens (ray_network.POD_PORTS, what node.py starts
    Ray with) and the head's GCS port."""
    first, last = POD_PORTS.workers
    single = sorted({RAY_GCS_PORT, *POD_PORTS.named().values()})
    return [*({"protocol": "TCP", "port": p} for p in single), {"protocol": "TCP", "port": first, "endPort": last}]


def _network_policies(job: RLJob, owner: Owner | None) -> list[Manifest]:
    """Ingress to the job's pods: Ray's ports and the http port from the job's own pods only, the
    metrics ports (Prometheus text, health; nothing that writes) from anywhere, so that any
    Prometheus can scrape them; and between rollout and train pods any port, for torch.distributed.
    Egress stays open (the API server, Redis, model and data stores). The operator needs no ingress:
    it talks to the API server only."""
    name = job.metadata.name

    def pods(roles: tuple[Role, ...] | None = None) -> dict[str, Any]:  # a fresh dict each: no YAML aliases
        chosen: dict[str, Any] = {"matchLabels": job_selector(name)}
        if roles is not None:
            chosen["matchExpressions"] = [{"key": COMPONENT_KEY, "operator": "In", "values": list(roles)}]
        return chosen

    metrics = [{"protocol": "TCP", "port": HTTP_PORT}, {"protocol": "TCP", "port": POD_PORTS.named()["ray-metrics"]}]
    return [
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": _metadata(job, child_name(name, "pods"), owner),
         "spec": {"podSelector": pods(), "policyTypes": ["Ingress"],
                  "ingress": [{"from": [{"podSelector": pods()}],
                               "ports": [*ray_ports(), {"protocol": "TCP", "port": HTTP_PORT}]},
                              {"ports": metrics}]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": _metadata(job, child_name(name, "dist"), owner),
         "spec": {"podSelector": pods(_COLLECTIVES), "policyTypes": ["Ingress"],
                  "ingress": [{"from": [{"podSelector": pods(_COLLECTIVES)}]}]}},
    ]


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
    objects += _network_policies(job, owner)
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
