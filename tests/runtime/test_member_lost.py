"""A cluster's controller tells a member of its run lost (its pod evicted, drained, OOM-killed: a Ray
actor, node or object of another pod gone) from its own failure, and exits with the member-lost code
for the first only; one machine's `rhymerl run` still exits 1 for both. No Ray is started."""

from __future__ import annotations

import pytest
import ray.exceptions

from rhymerl.api.roles import CLEAN_EXIT_CODES, MEMBER_LOST_EXIT_CODE, REJOIN_EXIT_CODE
from rhymerl.errors import RunFailed
from rhymerl.workers.controller.fleet import WorkerLost
from rhymerl.workers.controller.transport import ResultLost, WorkerGone
from rhymerl.workers.runtime.controller_pod import member_lost_exit
from rhymerl.workers.runtime.ray_backend import MemberLost, run_failure


def _train_call_failed(cause: BaseException) -> BaseException:
    return ray.exceptions.RayTaskError("TrainWorker.step", "Traceback ...", cause).as_instanceof_cause()


MEMBER_LOSSES = {
    "the train worker's actor died": ray.exceptions.ActorDiedError(),
    "its node died": ray.exceptions.NodeDiedError("node 1a2b died"),
    "an object died with its node": ray.exceptions.ObjectLostError("ff" * 28, "owner", ""),
    "a worker gone (the transport's)": WorkerGone("the train worker's call: ActorDiedError"),
    "a result lost (the transport's)": ResultLost("a rollout output"),
    "the fleet's re-runs used up": WorkerLost("step 3: sample 1 of prompt p7 lost its rollout worker 3 times"),
    "Ray's OOM killer": ray.exceptions.OutOfMemoryError("the node ran low on memory"),
    "a train call whose peer died": _train_call_failed(ray.exceptions.ActorDiedError()),
}
OWN_FAILURES = {
    "the GCS on its own head": ray.exceptions.RaySystemError("System error: the GCS is gone"),
    "its own raylet": ray.exceptions.LocalRayletDiedError(),
}


@pytest.mark.parametrize("name", sorted(MEMBER_LOSSES))
def test_a_member_of_the_run_lost_ends_it_as_member_lost_with_exit_1_on_one_machine(name: str) -> None:
    failure = run_failure(MEMBER_LOSSES[name], "/runs/r")
    assert isinstance(failure, MemberLost) and failure.exit_code == 1
    assert member_lost_exit(failure, head_alive=True) == MEMBER_LOST_EXIT_CODE


@pytest.mark.parametrize("name", sorted(OWN_FAILURES))
def test_the_controllers_own_ray_failing_is_a_run_failure_and_a_crash(name: str) -> None:
    failure = run_failure(OWN_FAILURES[name], "/runs/r")
    assert isinstance(failure, RunFailed) and not isinstance(failure, MemberLost)
    assert member_lost_exit(failure, head_alive=True) is None


def test_a_member_lost_while_the_controllers_own_head_is_dead_is_the_controllers_crash() -> None:
    failure = run_failure(ray.exceptions.ActorDiedError(), "/runs/r")
    assert isinstance(failure, MemberLost)
    assert member_lost_exit(failure, head_alive=False) is None


def test_the_member_lost_code_is_none_of_the_clean_codes_nor_a_signals() -> None:
    assert MEMBER_LOST_EXIT_CODE not in CLEAN_EXIT_CODES | {1, 2, REJOIN_EXIT_CODE}
    assert MEMBER_LOST_EXIT_CODE < 128
