"""The rollout fleet: its engine, size and autoscaling, sampling, and the speculation it decodes with."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rhymerl.api.blocks import DAY_S, MAX_BATCH, MAX_REPLICAS, NonNegInt, PositiveInt, Replicas, Seed, Strict
from rhymerl.api.placement import Placement, Resources, SpotSpec
from rhymerl.api.speculation import SpeculationSpec


class AutoscalingSpec(Strict):
    """The operator sizes the rollout fleet from the controller's recommendation (status.progress.
    recommendedRolloutWorkers), within min_replicas and max_replicas."""

    enabled: bool = Field(False, description="true: the operator sets the rollout pod count (spec.rollout.replicas is "
                          "only the starting size; do not point an HorizontalPodAutoscaler or a KEDA ScaledObject at the "
                          "scale subresource as well: docs/operations.md, \"Autoscaling\")")
    cooldown_seconds: NonNegInt = Field(300, le=DAY_S, description="least time between two changes of the rollout "
                                        f"pod count (at most {DAY_S}, a day)")
    max_step: PositiveInt = Field(2, le=MAX_REPLICAS, description="most rollout pods added or removed in one change")


class RolloutSpec(Placement):
    engine: Literal["torch", "vllm"] = "torch"
    replicas: Replicas = 1
    min_replicas: Replicas = 1
    max_replicas: Replicas = 1
    gpus_per_replica: NonNegInt = Field(0, le=64, description="tensor-parallel GPUs per rollout replica (at most 64)")
    weight_sync: Literal["collective", "object-store"] = Field(
        "collective", description="how a new policy version reaches rollout workers that are processes of their own "
        "(the ray backend, a cluster): collective, a torch.distributed broadcast from the train worker beside the "
        "calls they run, the object store's copy only where a broadcast fails; object-store, Ray's object store "
        "alone. The local backend hands them over in its process"
    )
    temperature: float = Field(1.0, ge=0.0, le=100.0, description="0 means greedy (at most 100)")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Seed = Field(0, description="sampling seed; a token depends only on (seed, sample id, position, logits)")
    max_batch_size: PositiveInt = Field(256, le=MAX_BATCH, description="sequences decoded together per replica "
                                        f"(at most {MAX_BATCH}; a local run also checks its KV cache fits memory)")
    speculation: SpeculationSpec = Field(default_factory=SpeculationSpec)
    adaptive_threads: bool = Field(
        True, description="torch engine: time decode passes at the configured torch thread count and at fewer, and run "
        "the faster, re-checked as the machine's load changes (a CPU shared with busy processes then costs about its "
        "fair share, not several times it). Tokens do not depend on it: rhymerl runs MKL in its strict reproducibility "
        "mode (MKL_CBWR=AUTO,STRICT, unless set otherwise), where a product does not depend on the thread count"
    )
    resources: Resources = Field(default_factory=Resources)
    spot: SpotSpec = Field(default_factory=SpotSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    termination_grace_seconds: int = Field(
        60, ge=10, le=DAY_S, description="SIGTERM to SIGKILL of a rollout pod (10 to 86400): its workers hand their "
        "unfinished samples back with their tokens in it (a scale-down, an eviction, a spot notice; a node's own "
        "shutdown grace may be shorter: docs/operations.md, \"Spot\")")

    @model_validator(mode="after")
    def _replica_bounds(self) -> RolloutSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas: must be >= min_replicas")
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError("replicas: must lie between min_replicas and max_replicas")
        if self.autoscaling.enabled and self.min_replicas == self.max_replicas:
            raise ValueError(f"autoscaling: min_replicas equals max_replicas ({self.max_replicas}): nothing to scale; "
                             "raise max_replicas, or leave autoscaling off")
        if self.resources.gpu < self.gpus_per_replica:
            raise ValueError("resources: gpu must be at least gpus_per_replica (a replica's GPUs are its pod's)")
        if self.engine == "vllm" and self.speculation.freed_drafters and not self.speculation.reads_history:
            raise ValueError("speculation: freed_drafters on vLLM needs method history or fastest-of-n (rhymerl's "
                             "proposer verifies the freed drafters' drafts inside vLLM)")
        if self.engine == "vllm" and self.speculation.freed_drafters and self.gpus_per_replica > 1:
            raise ValueError("speculation: freed_drafters on vLLM needs gpus_per_replica 1 (a drafter's link reaches "
                             "rhymerl's proposer only where vLLM's one worker runs in the rollout worker's process)")
        affinity = self.pod.affinity
        if self.spot.enabled and self.spot.node_selector and affinity is not None and affinity.nodeAffinity is not None:
            raise ValueError("pod.affinity.nodeAffinity: spot.node_selector sets the rollout pods' node affinity; "
                             "put the node labels there")
        return self
