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

CPU_REQUEST_ENV = "RHYMERL_CPU_REQUEST"
"""A pod's CPU request in whole cores, rounded up (the downward API's): the threads its workers
compute with where the pod has no CPU limit, rather than every core of the node."""


def workers_per_pod(job: RLJob, role: Role) -> int:
    """Workers of `role` one pod hosts: a train pod one rank per GPU (one without GPUs), the others one."""
    return max(job.spec.train.resources.gpu, 1) if role == "train" else 1


def train_ranks(job: RLJob) -> int:
    """Ranks of the train role (data-parallel training): one per GPU of each train pod, or one per pod."""
    return job.spec.train.replicas * workers_per_pod(job, "train")
