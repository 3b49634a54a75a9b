"""The RLJob spec: the one contract read by the CLI, the CRD generator, the operator and every worker.

Every default is defined once, in the block that holds it (rhymerl.api.inputs, algorithm, rollout,
speculation, scheduling, placement, services); this module puts the blocks together into the RLJob, with
the checkpoint and failure settings and the rules that span blocks.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rhymerl.api.algorithm import AlgorithmSpec
from rhymerl.api.blocks import NonNegInt, PositiveInt, Quantity, Strict
from rhymerl.api.inputs import DataSpec, ModelSpec
from rhymerl.api.k8s_values import Annotations, Dns1123Label, Dns1123Subdomain, LabelValue, QualifiedName
from rhymerl.api.placement import ImagesSpec, RoleSpec
from rhymerl.api.rollout import RolloutSpec
from rhymerl.api.scheduling import SchedulingSpec
from rhymerl.api.services import ControllerSpec, HistorySpec, RewardSpec
from rhymerl.api.speculation import EMBEDDED_DRAFTS

GROUP = "rhymerl.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"
# A StatefulSet's name must stay within 52 characters (its pods' controller-revision-hash label adds 11 to
# it, and labels end at 63); the longest child is `<job>-controller`.
MAX_JOB_NAME = 52 - len("-controller")


class StorageSpec(Strict):
    """The volume checkpoints live on in a cluster (a PersistentVolumeClaim per controller and train pod):
    what lets a suspended or restarted job resume."""

    size: Quantity = "20Gi"
    storage_class: Dns1123Subdomain | None = Field(None, max_length=253, description="default: the cluster's default "
                                      "StorageClass")
    keep_on_delete: bool = Field(True, description="keep the claims when the RLJob is deleted (delete them by "
                                 "hand); false: deleted with it")


class CheckpointSpec(Strict):
    every_steps: PositiveInt = Field(1, le=1_000_000, description="save model, optimiser and loop state every N "
                                     "steps (at most 1000000)")
    keep_last: PositiveInt = Field(2, le=1000, description="checkpoints kept on disk (at most 1000)")
    storage: StorageSpec = Field(default_factory=StorageSpec)


class FailurePolicySpec(Strict):
    backoff_limit: NonNegInt = Field(3, le=1000, description="pod crashes tolerated before the job is Failed "
                                     "(at most 1000); spot preemptions and evictions never count")


class RLJobSpec(Strict):
    backend: Literal["local", "ray"] = Field(
        "local", description="how `rhymerl run` executes the job on one machine: local (one process) or ray (each "
        "role a Ray actor on a local Ray cluster, as in a cluster, with pipelined rollout at "
        "algorithm.max_off_policy_steps >= 1); a cluster always runs ray"
    )
    suspend: bool = Field(False, description="true: the controller pod finishes its step and checkpoints, then "
                          "every role is scaled to zero (the other roles once the controller pod is gone, or after "
                          "controller.termination_grace_seconds plus a minute); false again: resume from the last "
                          "checkpoint")
    active_deadline_seconds: PositiveInt | None = Field(
        None, le=31_536_000, description="the job Fails (reason DeadlineExceeded) once it has run this long since "
        "it started or was last resumed, and every role is scaled to zero (at most a year)")
    ttl_seconds_after_finished: NonNegInt | None = Field(
        None, le=31_536_000, description="delete the RLJob (and its children) this long after it Succeeded or "
        "Failed (at most a year); unset: keep it")
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    reward: RewardSpec = Field(default_factory=RewardSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    train: RoleSpec = Field(default_factory=RoleSpec)
    history: HistorySpec = Field(default_factory=HistorySpec)
    controller: ControllerSpec = Field(default_factory=ControllerSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    failure_policy: FailurePolicySpec = Field(default_factory=FailurePolicySpec)
    images: ImagesSpec = Field(default_factory=ImagesSpec)

    @model_validator(mode="after")
    def _draft_model_given(self) -> RLJobSpec:
        speculation = self.rollout.speculation
        use = speculation.draft_model_use
        if use is None or speculation.draft_model is not None:
            return self
        embedded = EMBEDDED_DRAFTS.get(self.model.path)
        if embedded is None:
            raise ValueError(f"rollout.speculation.draft_model: required when {use} (model.path {self.model.path} has "
                             "no embedded draft model)")
        speculation.draft_model = embedded
        return self

    @model_validator(mode="after")
    def _engine_runs_model(self) -> RLJobSpec:
        if self.model.implementation == "transformers" and self.rollout.engine == "torch":
            raise ValueError("rollout.engine: the torch engine decodes rhymerl's native model only; a model with "
                             "implementation transformers rolls out with engine vllm")
        return self


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # a job with it is queued by Kueue (docs/operations.md)


class Metadata(Strict):
    name: str = Field(
        "rljob", pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=MAX_JOB_NAME,
        description=f"a DNS-1035 label of at most {MAX_JOB_NAME} characters: it names the job's Services and "
        "StatefulSets",
    )
    namespace: Dns1123Label | None = None
    labels: dict[QualifiedName, LabelValue] = Field(default_factory=dict)
    annotations: Annotations = Field(default_factory=dict)


class RLJob(Strict):
    """The whole object as written in YAML; `spec` is what the CRD schema describes."""

    apiVersion: Literal["rhymerl.io/v1alpha1"] = "rhymerl.io/v1alpha1"
    kind: Literal["RLJob"] = "RLJob"
    metadata: Metadata = Field(default_factory=Metadata)
    spec: RLJobSpec = Field(default_factory=RLJobSpec)

    @model_validator(mode="after")
    def _queued_at_one_size(self) -> RLJob:
        rollout = self.spec.rollout
        if KUEUE_QUEUE_LABEL in self.metadata.labels and rollout.min_replicas != rollout.max_replicas:
            raise ValueError(f"spec.rollout: a job labelled {KUEUE_QUEUE_LABEL} is admitted whole, at one size: "
                             f"min_replicas ({rollout.min_replicas}) must equal max_replicas ({rollout.max_replicas})")
        return self


def importance_level(spec: RLJobSpec, pipelined: bool) -> Literal["none", "token", "sequence"]:
    """algorithm.off_policy_correction with `auto` resolved; `pipelined`: rollout runs ahead of training."""
    chosen = spec.algorithm.off_policy_correction
    if chosen != "auto":
        return chosen
    return "token" if spec.rollout.engine == "vllm" or pipelined else "none"
