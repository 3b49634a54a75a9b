"""The RLJob's status: written by the operator, except `progress` (the job's controller pod)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from rhymerl.api.blocks import NonNegInt

Phase = Literal["Pending", "Running", "Suspended", "Succeeded", "Failed"]
ConditionType = Literal["Ready", "RolloutReady", "TrainReady", "Degraded", "Suspended", "Complete", "Failed",
                        "Draining", "Queued"]
CONDITION_TYPES: tuple[ConditionType, ...] = ("Ready", "RolloutReady", "TrainReady", "Degraded", "Suspended",
                                              "Complete", "Failed", "Draining", "Queued")


class Condition(BaseModel):
    """A metav1.Condition: one per type; lastTransitionTime moves only when status flips."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field("", description="CamelCase cause, e.g. Unschedulable, BackoffLimitExceeded, InvalidSpec")
    message: str = ""
    lastTransitionTime: str = Field("", description="RFC 3339 time the status last changed")
    observedGeneration: NonNegInt = Field(0, description="metadata.generation the condition was computed from")


class RoleStatus(BaseModel):
    desired: NonNegInt = 0
    ready: NonNegInt = 0


class Progress(BaseModel):
    """Headline numbers of the last finished step; written only by the job's controller pod."""

    step: NonNegInt = 0
    epoch: NonNegInt = 0
    policyVersion: NonNegInt = 0
    rewardMean: float | None = None
    acceptanceRate: float | None = Field(None, description="accepted / drafted speculative tokens")
    bubbleRatio: float | None = Field(None, description="idle rollout worker-time / (workers x makespan)")
    lastStepSeconds: float | None = None
    rolloutWorkers: NonNegInt | None = Field(None, description="rollout workers in the fleet after the last step")
    rolloutWorkersWanted: NonNegInt | None = Field(None, description="rollout workers the job wanted then "
                                                   "(spec.rollout.replicas)")
    recommendedRolloutWorkers: NonNegInt | None = Field(
        None, description="the fleet size the controller recommends for the next step, within min_replicas and "
        "max_replicas: from the predicted remaining work and the measured throughput per worker")
    draftingRolloutWorkers: NonNegInt | None = Field(
        None, description="the most rollout workers that drafted for others at once in the last step "
        "(spec.rollout.speculation.freedDrafters: workers the round's tail freed)")
    rolloutPodsInUse: NonNegInt | None = Field(
        None, description="the rollout pods that hold the fleet's workers lie within ordinals 0..N-1, so a "
        "scale-down to N pods or more takes no sample away (written whenever it changes)")
    message: str | None = Field(None, max_length=500, description="what the controller is doing or waiting for")
    updatedAt: str | None = Field(None, description="RFC 3339 time of the report")
    finished: bool = Field(False, description="true once the last step is done: the job is Complete")


class CountedPod(BaseModel):
    """A pod whose failures are already counted, so that each one counts once across operator restarts."""

    pod: str
    uid: str
    restarts: NonNegInt = 0
    preempted: bool = False
    evicted: bool = False  # evicted over its own limits (counted as a crash, once)


class Failures(BaseModel):
    crashes: NonNegInt = Field(0, description="container crashes (restarts), counted against "
                               "spec.failure_policy.backoff_limit")
    preemptions: NonNegInt = Field(0, description="pods lost to spot preemption, eviction or node loss; never "
                                   "counted as crashes")
    restarts: NonNegInt = Field(0, description="container restarts that are not crashes (exit 0, or a pod asking "
                                "to rejoin its job's Ray head); never counted as crashes")
    unexplainedMemberLoss: NonNegInt = Field(0, description="controller restarts in a row after a member of the run "
                                             "was lost (exit 76) with no member pod preempted or crashing since; past "
                                             "3 each counts as a crash")
    lastFailure: str = ""
    counted: list[CountedPod] = Field(default_factory=list)


class AutoscalingStatus(BaseModel):
    """What spec.rollout.autoscaling decided last (the operator's)."""

    replicas: NonNegInt = Field(0, description="rollout pods the operator runs now")
    lastScaleTime: str = Field("", description="RFC 3339 time the count last changed (empty: it has not)")
    message: str = Field("", max_length=1024, description="why the count is what it is")


class RLJobStatus(BaseModel):
    """Written by the operator, except `progress` (the job's controller pod); never by users."""

    phase: Phase = "Pending"
    observedGeneration: NonNegInt = 0
    conditions: list[Condition] = Field(default_factory=list)
    roles: dict[str, RoleStatus] = Field(default_factory=dict, description="pods per role: desired and ready")
    replicas: NonNegInt = Field(0, description="ready rollout pods (the scale subresource's status replicas)")
    selector: str = Field("", description="label selector of the rollout pods (the scale subresource's, for HPA)")
    progress: Progress | None = None
    failures: Failures = Field(default_factory=Failures)
    autoscaling: AutoscalingStatus | None = Field(None, description="spec.rollout.autoscaling's last decision "
                                                  "(absent when it is off)")
