"""Where and with what a role's pods run: resources, node selection, tolerations, spread, spot nodes
and images. Every role's block is a Placement (RoleSpec: one with replicas and resources, train's)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from rhymerl.api.blocks import WEEK_S, NonNegInt, PositiveInt, Quantity, Replicas, Strict
from rhymerl.api.k8s_values import Dns1123Subdomain, ImageRef, LabelValue, QualifiedName
from rhymerl.api.pod import PodOverrides

GPU_RESOURCE = "nvidia.com/gpu"


class Resources(Strict):
    cpu: Quantity = "1"
    memory: Quantity = "2Gi"
    gpu: NonNegInt = Field(0, le=64, description="GPUs of one pod, all on one node (at most 64)")
    extra: dict[QualifiedName, Quantity] = Field(
        default_factory=dict, max_length=16, description="other resources of one pod, requested and limited alike "
        "(extended resources such as rdma/hca or a device plugin's; ephemeral-storage); at most 16")

    @model_validator(mode="after")
    def _extra_not_named(self) -> Resources:
        for key in self.extra:
            if key in ("cpu", "memory", GPU_RESOURCE):
                raise ValueError(f"extra: {key} has its own field (cpu, memory, gpu)")
        return self


MAX_SCHEDULING_ITEMS = 32  # node selector labels or tolerations of one role: CEL cost bounds need a cap
NodeSelector = Annotated[dict[QualifiedName, LabelValue], Field(max_length=MAX_SCHEDULING_ITEMS, description="node labels a pod "
                                               f"requires (at most {MAX_SCHEDULING_ITEMS})")]


class Toleration(Strict):
    """A Kubernetes toleration, as in a Pod (`tolerationSeconds`)."""

    key: QualifiedName | None = Field(None, max_length=316, description="taint key; omitted with operator Exists: "
                                      "every taint")
    operator: Literal["Equal", "Exists"] = "Equal"
    value: LabelValue | None = Field(None, max_length=63, description="taint value (operator Equal only)")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(None, description="omitted: "
                                                                                  "every effect")
    toleration_seconds: NonNegInt | None = Field(None, le=WEEK_S, description="NoExecute only: seconds the pod "
                                                 f"stays on a node after the taint appears (at most {WEEK_S}, a week; "
                                                 "omit it to stay for good)")

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("value: must be omitted when operator is Exists")
        if self.key is None and self.operator != "Exists":
            raise ValueError("operator: must be Exists when key is omitted")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds: only with effect NoExecute")
        return self


class TopologySpread(Strict):
    """Spread a role's pods over a topology domain (one topologySpreadConstraint)."""

    enabled: bool = Field(True, description="false: no spread constraint")
    max_skew: PositiveInt = Field(1, le=1024, description="largest difference in pod count between two domains")
    topology_key: QualifiedName = Field("kubernetes.io/hostname", min_length=1, max_length=316,
                              description="node label that names a domain, e.g. topology.kubernetes.io/zone")
    when_unsatisfiable: Literal["ScheduleAnyway", "DoNotSchedule"] = Field(
        "ScheduleAnyway", description="ScheduleAnyway: a preference; DoNotSchedule: a pod stays Pending rather "
        "than exceed max_skew"
    )


class Placement(Strict):
    """Where a role's pods may run; every role's block has these fields."""

    node_selector: NodeSelector = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_SCHEDULING_ITEMS,
                                          description=f"at most {MAX_SCHEDULING_ITEMS}")
    topology_spread: TopologySpread = Field(default_factory=TopologySpread)
    pod: PodOverrides = Field(default_factory=PodOverrides, description="what the role's pods get besides the "
                              "operator's: volumes, env, a service account, init containers, labels, scheduling")


class SpotSpec(Strict):
    """Spot (preemptible) nodes for rollout pods: a preempted rollout pod is replaced and never counts as a
    failure; no other role runs on them."""

    enabled: bool = False
    node_selector: NodeSelector = Field(default_factory=dict, description="labels of spot nodes, e.g. "
                                        "{cloud.google.com/gke-spot: 'true'} or {eks.amazonaws.com/capacityType: "
                                        "SPOT}: rollout pods get a node affinity for them")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_SCHEDULING_ITEMS,
                                          description="tolerations of the spot nodes' taints, e.g. "
                                          "kubernetes.azure.com/scalesetpriority=spot:NoSchedule")
    required: bool = Field(False, description="true: rollout pods run only on spot nodes; false: they prefer "
                           "spot nodes and fall back to others")

    @model_validator(mode="after")
    def _names_spot_nodes(self) -> SpotSpec:
        if self.enabled and not self.node_selector and not self.tolerations:
            raise ValueError("node_selector: name the spot nodes' labels (or their taints in tolerations)")
        return self


class RoleSpec(Placement):
    replicas: Replicas = 1
    resources: Resources = Field(default_factory=Resources)



# The image family (images/README.md): one Python and one Ray in both, CUDA and vLLM only in the GPU one.
WORKER_CPU_IMAGE = "ghcr.io/rhymerl/worker-cpu:0.1.0"
WORKER_GPU_IMAGE = "ghcr.io/rhymerl/worker-gpu:0.1.0"
_BY_GPUS = (f"default: {WORKER_GPU_IMAGE} when the role's pods have GPUs (rollout: or engine vllm), "
            f"{WORKER_CPU_IMAGE} otherwise")


class ImagesSpec(Strict):
    controller: ImageRef = WORKER_CPU_IMAGE
    rollout: ImageRef | None = Field(None, description=_BY_GPUS)
    train: ImageRef | None = Field(None, description=_BY_GPUS)
    reward: ImageRef = WORKER_CPU_IMAGE
    history: ImageRef = WORKER_CPU_IMAGE
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    pull_secrets: list[Annotated[Dns1123Subdomain, Field(max_length=253)]] = Field(
        default_factory=list, max_length=16, description="imagePullSecrets of every pod (Secrets in the job's "
        "namespace)"
    )
