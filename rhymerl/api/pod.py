"""Per-role pod template overrides (`spec.<role>.pod`): what a user adds to the operator's pods to get
their model, data, reward code and cluster plumbing in (volumes, env, a service account, init steps,
labels, scheduling).

Kubernetes' own shapes inside (a volume is written as in a Pod: `{name: x, persistentVolumeClaim:
{claimName: y}}`), checked here as far as a mistake would otherwise surface only when a pod fails to
start: names, the one source of a volume, mounts of declared volumes, and anything that would undo
the operator's own pod (its labels, volumes, mount paths however spelled, environment, container
hardening). A credential written as an environment literal is refused (rhymerl.api.credentials): the
overrides are stored in the RLJob and its ConfigMap and rendered into the StatefulSets. The
deep shapes (a volume's source, `valueFrom`, affinity terms, an init container's other fields) are
kept as written (`x-kubernetes-preserve-unknown-fields` in the CRD) and left to the API server, which
checks them against its own schema when the operator applies the StatefulSet.
"""

from __future__ import annotations

import posixpath
from functools import partial
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from rhymerl.api.credentials import literal_credential
from rhymerl.api.k8s_values import (
    ENV_VAR_NAME,
    MAX_ANNOTATION_BYTES,
    Dns1123Label,
    Dns1123Subdomain,
    ImageRef,
    LabelValue,
    QualifiedName,
    annotations_within,
    env_var_name,
)
from rhymerl.api.sources import CACHE_ROOT, PVC_ROOT

PRESERVE: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}
MAX_ITEMS = 32  # of each list or map: CEL cost bounds and etcd's object size want a cap
MAX_INIT_CONTAINERS = 8
# What the operator's pods already use (operator/manifests: labels.py, containers.py, pods.py, roles.py);
# tests/operator/test_rendered_overrides.py checks these against what the builders write.
OPERATOR_LABELS = frozenset({"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
                             "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by"})
OPERATOR_ANNOTATION_PREFIX = "rhymerl.io/"
OPERATOR_VOLUMES = frozenset({"spec", "scratch", "data", "ray-token", "dshm", "fetch-source-0", "fetch-source-1",
                              "model-cache"})
OPERATOR_MOUNT_PATHS = frozenset({"/etc/rhymerl", "/tmp", "/var/lib/rhymerl", "/var/run/rhymerl/ray", "/dev/shm",
                                  PVC_ROOT, CACHE_ROOT})
OPERATOR_ENV_PREFIXES = ("RHYMERL_", "RAY_AUTH_")
OPERATOR_ENV = frozenset({"HOME", "PYTHONUNBUFFERED"})
OPERATOR_CONTAINERS = frozenset({"controller", "rollout", "train", "reward", "history", "fetch"})
# Kubernetes' VolumeSource kinds (core/v1 Volume): exactly one per volume.
VOLUME_SOURCES = frozenset({
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi", "downwardAPI",
    "emptyDir", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs",
    "hostPath", "image", "iscsi", "nfs", "persistentVolumeClaim", "photonPersistentDisk", "portworxVolume",
    "projected", "quobyte", "rbd", "scaleIO", "secret", "storageos", "vsphereVolume",
})
OPERATOR_ANNOTATION_BYTES = 1024  # the pod template's own: rhymerl.io/spec-hash and Kueue's group size
EnvName = Annotated[str, Field(min_length=1, max_length=256, pattern=ENV_VAR_NAME.pattern),
                    AfterValidator(env_var_name)]
SECRET_ADVICE = ("a literal is stored in the RLJob, its ConfigMap and the pods' StatefulSet: take it from a Secret, "
                 "with valueFrom.secretKeyRef (or the Secret's keys with envFrom.secretRef)")
Preserved = Annotated[dict[str, Any], Field(json_schema_extra=PRESERVE)]


class _Shape(BaseModel):
    """A Kubernetes object as written in a Pod: its field names camelCase, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, hide_input_in_errors=True)


class _Open(BaseModel):
    """A Kubernetes object whose other fields are kept as written (and checked by the API server)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, hide_input_in_errors=True,
                              json_schema_extra=PRESERVE)


class EnvVar(_Shape):
    name: EnvName
    value: str | None = Field(None, max_length=32_768)
    valueFrom: Preserved | None = Field(None, description="secretKeyRef, configMapKeyRef, fieldRef or "
                                        "resourceFieldRef, as in a Pod")

    @model_validator(mode="after")
    def _not_the_operators(self) -> EnvVar:
        if self.name in OPERATOR_ENV or self.name.startswith(OPERATOR_ENV_PREFIXES):
            raise ValueError(f"name: {self.name} is set by the operator (HOME, PYTHONUNBUFFERED, RHYMERL_*, "
                             "RAY_AUTH_*)")
        if self.value is not None and self.valueFrom is not None:
            raise ValueError("valueFrom: give value or valueFrom, not both")
        why = literal_credential(self.name, self.value)
        if why is not None:
            raise ValueError(f"value: {why}; {SECRET_ADVICE}")
        return self


class _NamedRef(_Shape):
    name: Dns1123Subdomain = Field(max_length=253)
    optional: bool | None = None


def _env_prefix(value: str) -> str:
    """envFrom's prefix: none, or the start of an environment variable name (Kubernetes checks it so)."""
    return env_var_name(value) if value else value


class EnvFromSource(_Shape):
    configMapRef: _NamedRef | None = None
    secretRef: _NamedRef | None = None
    prefix: Annotated[str, Field(max_length=256), AfterValidator(_env_prefix)] | None = None

    @model_validator(mode="after")
    def _one_ref(self) -> EnvFromSource:
        if (self.configMapRef is None) == (self.secretRef is None):
            raise ValueError("configMapRef: give exactly one of configMapRef and secretRef")
        return self


class Volume(_Open):
    """A pod volume: its name and exactly one source (`configMap`, `persistentVolumeClaim`, `csi`, ...)."""

    name: Dns1123Label = Field(max_length=63)

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        if self.name in OPERATOR_VOLUMES:
            raise ValueError(f"name: {self.name} is one of the operator's volumes ({', '.join(sorted(OPERATOR_VOLUMES))})")
        sources = sorted((self.model_extra or {}).keys())
        unknown = [s for s in sources if s not in VOLUME_SOURCES]
        if unknown:
            raise ValueError(f"{unknown[0]}: not a volume source (one of {', '.join(sorted(VOLUME_SOURCES))})")
        if len(sources) != 1:
            raise ValueError(f"name: volume {self.name} needs exactly one source (configMap, secret, "
                             f"persistentVolumeClaim, csi, ...), has {len(sources)}")
        if not isinstance((self.model_extra or {})[sources[0]], dict):
            raise ValueError(f"{sources[0]}: must be a mapping, as in a Pod")
        return self


class VolumeMount(_Shape):
    name: Dns1123Label = Field(max_length=63)
    mountPath: str = Field(min_length=2, max_length=4096, pattern=r"^/")
    readOnly: bool | None = None
    subPath: str | None = Field(None, max_length=4096)
    subPathExpr: str | None = Field(None, max_length=4096)
    mountPropagation: Literal["None", "HostToContainer", "Bidirectional"] | None = None

    @model_validator(mode="after")
    def _free_path(self) -> VolumeMount:
        clash = reserved_clash(self.mountPath)
        if clash is not None:
            raise ValueError(f"mountPath: {self.mountPath} {clash}; mount it elsewhere (e.g. /models or /opt/code)")
        if self.subPath is not None and self.subPathExpr is not None:
            raise ValueError("subPathExpr: give subPath or subPathExpr, not both")
        return self


def mount_path(path: str) -> str:
    """The directory a container runtime mounts at for `path`: '.' and '..' resolved, slashes collapsed
    (a leading '//' too, which POSIX leaves to the system and Linux reads as '/')."""
    return "/" + posixpath.normpath(path).lstrip("/")


def _within(inner: str, outer: str) -> bool:
    return inner == outer or outer == "/" or inner.startswith(f"{outer}/")


def reserved_clash(path: str) -> str | None:
    """How a user's mount at `path` meets one of the operator's (OPERATOR_MOUNT_PATHS), compared as a
    container runtime reads both ('is inside /tmp, where ...'); None where it meets none."""
    at, where = mount_path(path), "where the operator mounts its own volumes"
    for reserved in sorted(OPERATOR_MOUNT_PATHS):
        if at == reserved:
            return f"is {where}" if at == path else f"is {reserved} as a container runtime reads it, {where}"
        if _within(reserved, at):
            return f"contains {reserved}, {where}"
        if _within(at, reserved):
            return f"is inside {reserved}, {where}"
    return None


_WEAKENING: dict[str, Any] = {"privileged": True, "allowPrivilegeEscalation": True, "runAsNonRoot": False,
                              "runAsUser": 0}


class InitContainer(_Open):
    """A container run before the role's (and after the operator's fetch step), as in a Pod's
    initContainers; the pod's non-root, seccomp-confined security context applies to it too."""

    name: Dns1123Label = Field(max_length=63)
    image: ImageRef = Field(max_length=4096)

    @model_validator(mode="after")
    def _hardened(self) -> InitContainer:
        if self.name in OPERATOR_CONTAINERS:
            raise ValueError(f"name: {self.name} is one of the operator's containers")
        context = (self.model_extra or {}).get("securityContext") or {}
        if not isinstance(context, dict):
            raise ValueError("securityContext: must be a mapping, as in a Pod")
        for key, bad in _WEAKENING.items():
            if key in context and context[key] == bad:
                raise ValueError(f"securityContext.{key}: the job's pods run non-root, unprivileged (the operator's "
                                 "hardening); a container may not undo it")
        if (context.get("capabilities") or {}).get("add"):
            raise ValueError("securityContext.capabilities: the job's pods drop every capability and add none")
        env = (self.model_extra or {}).get("env") or []
        for i, item in enumerate(env if isinstance(env, list) else []):
            name, value = (item.get("name"), item.get("value")) if isinstance(item, dict) else (None, None)
            why = literal_credential(name, value) if isinstance(name, str) and isinstance(value, str) else None
            if why is not None:
                raise ValueError(f"env.{i}.value: {why}; {SECRET_ADVICE}")
        return self


class Affinity(_Shape):
    nodeAffinity: Preserved | None = None
    podAffinity: Preserved | None = None
    podAntiAffinity: Preserved | None = None


def _no_duplicates(what: str, names: list[str], field: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ValueError(f"{what}.{i}.{field}: {name} is named twice")
        seen.add(name)


class PodOverrides(BaseModel):
    """What a user adds to one role's pods; the operator's own settings stay and win nowhere by surprise:
    what would replace one of them is refused."""

    # Pod's own field names (serviceAccountName, volumeMounts, ...) as aliases, as in rhymerl.api.blocks.Strict
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, allow_inf_nan=False,
                              hide_input_in_errors=True)

    labels: dict[QualifiedName, LabelValue] = Field(default_factory=dict, max_length=MAX_ITEMS,
                                                    description="added to the pods' labels (not the selector)")
    annotations: Annotated[dict[QualifiedName, Annotated[str, Field(max_length=65_536)]], AfterValidator(
        partial(annotations_within, limit=MAX_ANNOTATION_BYTES - OPERATOR_ANNOTATION_BYTES))] = Field(
        default_factory=dict, max_length=MAX_ITEMS, description="added to the pods' annotations (keys and values "
        f"at most {MAX_ANNOTATION_BYTES - OPERATOR_ANNOTATION_BYTES} bytes together)")
    service_account_name: Dns1123Subdomain | None = Field(
        None, max_length=253, description="the pods' ServiceAccount (e.g. one with cloud storage access); its token "
        "is mounted. Not for the controller, whose own account patches the job's status")
    priority_class_name: Dns1123Subdomain | None = Field(None, max_length=253)
    scheduler_name: Dns1123Subdomain | None = Field(None, max_length=253)
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ITEMS * 2, description="added to the role's "
                              "container and the fetch step (e.g. PYTHONPATH for reward code, AWS_ENDPOINT_URL); a "
                              "credential (HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...) from a Secret with valueFrom."
                              "secretKeyRef: a literal one is refused")
    env_from: list[EnvFromSource] = Field(default_factory=list, max_length=MAX_ITEMS // 2,
                                          description="ConfigMaps or Secrets whose keys become environment of the "
                                          "role's container and the fetch step (e.g. S3 credentials)")
    volumes: list[Volume] = Field(default_factory=list, max_length=MAX_ITEMS)
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=MAX_ITEMS,
                                             description="mounts of `volumes` in the role's container and the "
                                             "fetch step")
    init_containers: list[InitContainer] = Field(default_factory=list, max_length=MAX_INIT_CONTAINERS,
                                                 description="run after the fetch step, before the role's container")
    affinity: Affinity | None = Field(None, description="the pods' affinity, as in a Pod (rollout with "
                                      "spot.node_selector: no nodeAffinity, the spot options set it)")

    @model_validator(mode="after")
    def _consistent(self) -> PodOverrides:
        for key in self.labels:
            if key in OPERATOR_LABELS:
                raise ValueError(f"labels: {key} is set by the operator (its selectors rely on it)")
        for key in self.annotations:
            if key.startswith(OPERATOR_ANNOTATION_PREFIX):
                raise ValueError(f"annotations: {key}: the {OPERATOR_ANNOTATION_PREFIX} prefix is the operator's")
        declared = [v.name for v in self.volumes]
        _no_duplicates("volumes", declared, "name")
        _no_duplicates("env", [e.name for e in self.env], "name")
        _no_duplicates("volume_mounts", [mount_path(m.mountPath) for m in self.volume_mounts], "mountPath")
        _no_duplicates("init_containers", [c.name for c in self.init_containers], "name")
        for i, mount in enumerate(self.volume_mounts):
            if mount.name not in declared:
                raise ValueError(f"volume_mounts.{i}.name: {mount.name} is not in volumes")
        return self
