"""A role's containers: its worker and the fetch step before it, with their image, command,
environment, mounts, resources and probes."""

from __future__ import annotations

from typing import Any

from rhymerl.api.history_keys import REDIS_PASSWORD_ENV
from rhymerl.api.k8s_values import quantity_value
from rhymerl.api.placement import GPU_RESOURCE, WORKER_CPU_IMAGE, WORKER_GPU_IMAGE, Placement, Resources
from rhymerl.api.roles import CPU_REQUEST_ENV, Role
from rhymerl.api.sources import CACHE_ROOT, PVC_ROOT, Fetches, fetches
from rhymerl.api.spec import RLJob, RLJobSpec
from rhymerl.operator.manifests.roles import (
    DATA_DIR,
    FETCH_CONTAINER,
    FIELD_ENV,
    GRACE_ENV,
    HEALTH_PATH,
    READS_MODEL,
    READY_PATH,
    RUNTIME,
    SCRATCH_DIR,
    SPEC_DIR,
    argv,
    environment,
    fetch_argv,
)
from rhymerl.operator.manifests.storage import model_cache_mount
from rhymerl.workers.runtime.ray_network import OBJECT_STORE_ENV, OBJECT_STORE_SHARE, TOKEN_DIR

SHM_DIR = "/dev/shm"


def stop_grace_s(job: RLJob, role: Role) -> int:
    """SIGTERM to SIGKILL of the role's pods: the controller's (a step and its checkpoint) and a rollout
    pod's (its workers hand their samples back) from the spec."""
    if role == "controller":
        return job.spec.controller.termination_grace_seconds
    if role == "rollout":
        return job.spec.rollout.termination_grace_seconds
    return RUNTIME[role].stop_grace_s


def role_block(spec: RLJobSpec, role: Role) -> tuple[Placement, Resources]:
    blocks: dict[Role, tuple[Placement, Resources]] = {
        "controller": (spec.controller, spec.controller.resources),
        "rollout": (spec.rollout, spec.rollout.resources),
        "train": (spec.train, spec.train.resources),
        "reward": (spec.reward, spec.reward.resources),
        "history": (spec.history, spec.history.resources),
    }
    return blocks[role]


def resource_requirements(resources: Resources) -> dict[str, Any]:
    requests = {"cpu": str(resources.cpu), "memory": str(resources.memory)}
    limits = {"memory": str(resources.memory)}
    if resources.gpu:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(resources.gpu)
    for key, amount in sorted(resources.extra.items()):  # extended resources: requests equal limits
        requests[key] = limits[key] = str(amount)
    return {"requests": requests, "limits": limits}


def object_store_bytes(resources: Resources) -> int:
    """The Ray object store of a pod with these resources: Ray's own default share of its memory
    (OBJECT_STORE_SHARE), set explicitly because the pod's /dev/shm is sized to hold it."""
    return int(float(quantity_value(resources.memory)) * OBJECT_STORE_SHARE)


def _env(job: RLJob, role: Role) -> list[dict[str, Any]]:
    named = {**environment(job.metadata.name, role), GRACE_ENV: str(stop_grace_s(job, role)),
             OBJECT_STORE_ENV: str(object_store_bytes(role_block(job.spec, role)[1]))}
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
    return [e.model_dump(mode="json", exclude_none=True) for e in role_block(job.spec, role)[0].pod.env]


def _user_env_from(job: RLJob, role: Role) -> dict[str, Any]:
    env_from = role_block(job.spec, role)[0].pod.env_from
    return {"envFrom": [e.model_dump(mode="json", exclude_none=True) for e in env_from]} if env_from else {}


def _user_mounts(job: RLJob, role: Role) -> list[dict[str, Any]]:
    return [m.model_dump(mode="json", exclude_none=True) for m in role_block(job.spec, role)[0].pod.volume_mounts]


def role_fetches(job: RLJob, role: Role) -> Fetches:
    wanted = fetches(job.spec.model.path, job.spec.data.source)
    return Fetches(wanted.model if role in READS_MODEL else None, wanted.data)


def model_cache_claim(job: RLJob, role: Role) -> str | None:
    """The model cache claim a pod of `role` mounts: where the job has one and the role reads the model."""
    cache = job.spec.model.cache
    return None if cache is None or role_fetches(job, role).model is None else cache.claim


def source_claims(wanted: Fetches) -> list[str]:
    """The claims of pvc:// sources; the i-th is volume `fetch-source-<i>` (reserved: api/pod.py)."""
    return sorted({s.where for s in (wanted.model, wanted.data) if s is not None and s.scheme == "pvc"})


def fetch_container(job: RLJob, role: Role, resources: Resources) -> dict[str, Any] | None:
    """The pod's fetch step: `rhymerl fetch` in the role's image, writing the model and data sources
    that are not paths into the pod's data volume (FETCH_DIR), where the resolved spec points the role
    (`localized`), the model onto the cache claim with spec.model.cache (read-write here, read-only in the
    role); a pvc:// source's claim is mounted read-only here only. It skips what a marker says
    is already there (a restarted pod on its volume claim). The role's env, envFrom and mounts apply,
    so credentials and endpoints (AWS_*, HF_TOKEN) reach it as they reach the role."""
    wanted = role_fetches(job, role)
    if not wanted.any:
        return None
    mounts: list[dict[str, Any]] = [{"name": "scratch", "mountPath": SCRATCH_DIR},
                                    {"name": "data", "mountPath": DATA_DIR}]
    mounts += [{"name": f"fetch-source-{i}", "mountPath": f"{PVC_ROOT}/{claim}", "readOnly": True}
               for i, claim in enumerate(source_claims(wanted))]
    cached = model_cache_claim(job, role) is not None
    mounts += [model_cache_mount(read_only=False)] if cached else []
    command = fetch_argv(None if wanted.model is None else wanted.model.text,
                         None if wanted.data is None else wanted.data.text, CACHE_ROOT if cached else None)
    plain = Resources(cpu=resources.cpu, memory=resources.memory)  # no GPU, no extended resources
    return {"name": FETCH_CONTAINER, "image": image(job, role), "imagePullPolicy": job.spec.images.pull_policy,
            "command": command[:1], "args": command[1:],
            "env": [{"name": "HOME", "value": SCRATCH_DIR}, *_user_env(job, role)], **_user_env_from(job, role),
            "resources": resource_requirements(plain), "volumeMounts": mounts + _user_mounts(job, role),
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
    gpu = role_block(spec, role)[1].gpu > 0 or (role == "rollout" and spec.rollout.engine == "vllm")
    return WORKER_GPU_IMAGE if gpu else WORKER_CPU_IMAGE


def worker_container(job: RLJob, role: Role, resources: Resources) -> dict[str, Any]:
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
    mounts += [model_cache_mount(read_only=True)] if model_cache_claim(job, role) is not None else []
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
        "resources": resource_requirements(resources),
        "volumeMounts": mounts,
        "startupProbe": probe(HEALTH_PATH, 10, max(1, runtime.startup_s // 10)),
        "livenessProbe": probe(HEALTH_PATH, 10, 3),
        "readinessProbe": probe(READY_PATH, 5, 3),
        "securityContext": _hardened(),
    }
