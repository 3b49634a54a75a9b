"""How many pods each role wants, and the Kueue pod group a queued job's pods form."""

from __future__ import annotations

from rhymerl.api.roles import ROLES, Role
from rhymerl.api.rollout import RolloutSpec
from rhymerl.api.spec import RLJob, RLJobSpec
from rhymerl.operator.manifests.labels import KUEUE_GROUP_LABEL, KUEUE_QUEUE_LABEL, KUEUE_TOTAL_ANNOTATION


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


def most_replicas(spec: RLJobSpec, role: Role) -> int:
    if role == "rollout":
        return spec.rollout.max_replicas
    if role == "reward":
        return spec.reward.replicas if spec.reward.function is not None else 0
    if role == "history":
        return spec.history.replicas
    return 1 if role == "controller" else spec.train.replicas
