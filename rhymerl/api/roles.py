"""The roles of a job's processes: one StatefulSet each in a cluster (the operator), one kind of
worker each in the distributed runtime (`rhymerl worker --role`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rhymerl.api.spec import RLJob

Role = Literal["controller", "rollout", "train", "reward", "history"]
ROLES: tuple[Role, ...] = ("controller", "rollout", "train", "reward", "history")

REJOIN_EXIT_CODE = 75
"""A pod of a job that exits with this (EX_TEMPFAIL) asks to be restarted to join the job's next Ray
head: its restart is not a crash. So is a restart after exit 0 (a controller that stopped on
SIGTERM after checkpointing its step). Member pods normally rejoin without exiting at all."""
CLEAN_EXIT_CODES = frozenset({0, REJOIN_EXIT_CODE})
MEMBER_LOST_EXIT_CODE = 76
"""The controller pod exits with this when a member of its run was lost (a train worker, a Ray node of
another pod, the rollout fleet's re-runs used up), not for a fault of its own: the restarted
controller resumes from the last checkpoint once the pods are back. The operator counts the loss on
the member pod that had it (a preemption, or that pod's crash), this exit as neither, and past
operator/reconcile/pods.MEMBER_LOST_LIMIT such exits in a row with no member pod preempted or crashing,
as crashes."""

CPU_REQUEST_ENV = "RHYMERL_CPU_REQUEST"
"""A pod's CPU request in whole cores, rounded up (the downward API's): the threads its workers
compute with where the pod has no CPU limit, rather than every core of the node."""


def workers_per_pod(job: RLJob, role: Role) -> int:
    """Workers of `role` one pod hosts: a train pod one rank per GPU (one without GPUs), the others one."""
    return max(job.spec.train.resources.gpu, 1) if role == "train" else 1


def train_ranks(job: RLJob) -> int:
    """Ranks of the train role (data-parallel training): one per GPU of each train pod, or one per pod."""
    return job.spec.train.replicas * workers_per_pod(job, "train")
