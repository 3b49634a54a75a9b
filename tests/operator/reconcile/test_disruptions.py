"""Disruptions are not crashes: a member pod's loss is counted once, on that pod (a preemption, or its
own crash), and the controller's restart after it (exit MEMBER_LOST_EXIT_CODE) as neither; restarts
nothing explains are bounded (reconcile.pods, reconcile.conditions). Pure: pod bodies in, counts out."""

from __future__ import annotations

import asyncio
from typing import Any

import kubernetes.client
import pytest
from operator_harness import Kube

from rhymerl.api.roles import MEMBER_LOST_EXIT_CODE
from rhymerl.api.status import Failures
from rhymerl.operator.progress import report
from rhymerl.operator.reconcile.conditions import Observation, conditions, phase
from rhymerl.operator.reconcile.pods import MEMBER_LOST_LIMIT, count, view

LIMIT = 3  # spec.failurePolicy.backoffLimit
NS = "team-a"


def pod(name: str, uid: str, role: str, restarts: int = 0, last_exit: int | None = None,
        evicted: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"name": role, "restartCount": restarts, "ready": not evicted, "state": {"running": {}}}
    if last_exit is not None:
        status["lastState"] = {"terminated": {"exitCode": last_exit, "reason": "OOMKilled" if last_exit == 137
                                              else "Error"}}
    conditions = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": str(not evicted)}]
    meta: dict[str, Any] = {"name": name, "uid": uid, "labels": {"app.kubernetes.io/component": role}}
    if evicted:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                           "message": "Eviction API: evicting"})
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Running", "conditions": conditions, "containerStatuses": [status]}}


def controller(restarts: int, last_exit: int = MEMBER_LOST_EXIT_CODE) -> dict[str, Any]:
    return pod("j-controller-0", "c-uid", "controller", restarts, last_exit if restarts else None)


def observe(failures: Failures) -> tuple[str, dict[str, tuple[str, str, str]]]:
    pods = [view(controller(1)), view(pod("j-train-0", "t-new", "train"))]
    obs = Observation(generation=1, suspend=False, backoff_limit=LIMIT,
                      desired={"controller": 1, "rollout": 0, "train": 1, "reward": 0, "history": 0},
                      pods=pods, failures=failures, finished=False)
    conds = conditions(obs)
    return phase(obs, conds), {c.type: (c.status, c.reason, c.message) for c in conds}


def test_a_controller_exit_after_a_lost_member_is_neither_a_crash_nor_clean() -> None:
    v = view(controller(2))
    assert (v.member_lost, v.clean_restart, v.crash, v.restarts) == (True, False, None, 2)


def test_a_train_pod_evicted_four_times_with_the_controller_exiting_member_lost_each_time_counts_no_crash() -> None:
    failures = Failures()
    for n in range(1, 5):
        evicted = pod("j-train-0", f"t-{n}", "train", evicted=True)
        if n % 2:  # the eviction and the controller's restart in one pass
            failures = count(failures, [view(controller(n)), view(evicted)]).failures
        else:  # the controller's restart seen a pass before the eviction
            failures = count(failures, [view(controller(n)), view(pod("j-train-0", f"t-{n}", "train"))]).failures
            failures = count(failures, [view(controller(n))], [view(evicted, gone=True)]).failures
    assert (failures.crashes, failures.preemptions, failures.restarts) == (0, 4, 4)
    job_phase, conds = observe(failures)
    assert job_phase != "Failed" and conds["Failed"][:2] == ("False", "WithinBackoffLimit")


def test_a_train_container_that_crashes_counts_once_on_the_train_pod_not_on_the_controller() -> None:
    oom = pod("j-train-0", "t-1", "train", restarts=1, last_exit=137)
    result = count(Failures(), [view(controller(1)), view(oom)])
    assert (result.failures.crashes, result.failures.restarts) == (1, 1)
    assert [(n.kind, n.pod) for n in result.notes] == [("crash", "j-train-0"), ("restart", "j-controller-0")]
    assert "exited 137 (OOMKilled)" in result.failures.lastFailure


def test_member_lost_exits_nothing_explains_count_as_crashes_past_the_limit_and_fail_the_job() -> None:
    failures = Failures()
    train = view(pod("j-train-0", "t-1", "train"))
    for n in range(1, MEMBER_LOST_LIMIT + 2):
        failures = count(failures, [view(controller(n)), train]).failures
    assert (failures.crashes, failures.unexplainedMemberLoss) == (1, MEMBER_LOST_LIMIT + 1)
    assert f"exited {MEMBER_LOST_EXIT_CODE}" in failures.lastFailure and "no member pod" in failures.lastFailure
    _, conds = observe(failures)
    assert "in a row with no member pod preempted or crashing" in conds["Failed"][2]
    for n in range(MEMBER_LOST_LIMIT + 2, MEMBER_LOST_LIMIT + 2 + LIMIT):
        failures = count(failures, [view(controller(n)), train]).failures
    job_phase, conds = observe(failures)
    assert failures.crashes == LIMIT + 1 and job_phase == "Failed"
    assert conds["Failed"][1] == "BackoffLimitExceeded" and "its run lost a member" in conds["Failed"][2]


def test_a_member_pods_preemption_starts_the_unexplained_run_again() -> None:
    failures = Failures()
    train = view(pod("j-train-0", "t-1", "train"))
    for n in range(1, MEMBER_LOST_LIMIT + 1):
        failures = count(failures, [view(controller(n)), train]).failures
    assert failures.unexplainedMemberLoss == MEMBER_LOST_LIMIT
    failures = count(failures, [view(controller(MEMBER_LOST_LIMIT + 1)),
                                view(pod("j-train-0", "t-1", "train", evicted=True))]).failures
    assert (failures.crashes, failures.unexplainedMemberLoss, failures.preemptions) == (0, 1, 1)


def test_a_controller_waiting_to_restart_after_a_lost_member_says_so_in_degraded() -> None:
    down = controller(1)
    down["status"]["conditions"][1]["status"] = "False"
    down["status"]["containerStatuses"][0].update(state={"waiting": {"reason": "CrashLoopBackOff"}}, ready=False)
    obs = Observation(generation=1, suspend=False, backoff_limit=LIMIT, desired={"controller": 1}, pods=[view(down)],
                      failures=Failures(restarts=1, unexplainedMemberLoss=1), finished=False)
    degraded = next(c for c in conditions(obs) if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "MemberLost")
    assert "j-controller-0" in degraded.message and "1 such restarts in a row" in degraded.message


def _over_limit(name: str, uid: str) -> dict[str, Any]:
    """A rollout pod the kubelet evicted for filling its emptyDir past its sizeLimit (the message format
    of pkg/kubelet/eviction/helpers.go emptyDirMessageFmt, with its DisruptionTarget condition)."""
    message = 'Usage of EmptyDir volume "data" exceeds the limit "22Gi". '
    body = pod(name, uid, "rollout")
    body["status"].update({"phase": "Failed", "reason": "Evicted", "message": message})
    body["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                         "reason": "TerminationByKubelet", "message": message})
    return body


def test_a_pod_evicted_over_its_own_storage_limit_is_a_crash_counted_once_not_a_preemption() -> None:
    first = view(_over_limit("j-rollout-0", "r-1"))
    assert (first.preempted, first.evicted) == (None, 'Usage of EmptyDir volume "data" exceeds the limit "22Gi".')
    failures = count(Failures(), [first]).failures
    failures = count(failures, [first]).failures  # seen again by the next pass: counted once
    assert (failures.crashes, failures.preemptions) == (1, 0)
    assert "evicted over its own limits" in (failures.lastFailure or "")
    for n in range(2, LIMIT + 2):  # each replacement fills the volume again: the backoff limit ends it
        failures = count(failures, [view(_over_limit("j-rollout-0", f"r-{n}"))]).failures
    assert failures.crashes == LIMIT + 1
    # a node-pressure eviction (the node's disk, not the pod's limit) stays a preemption
    pressure = pod("j-rollout-0", "r-9", "rollout")
    pressure["status"].update({"reason": "Evicted", "message": "The node was low on resource: ephemeral-storage. "})
    assert view(pressure).preempted is not None and view(pressure).evicted is None


@pytest.mark.asyncio
async def test_a_job_whose_train_pod_is_evicted_four_times_and_a_rollout_pod_drained_succeeds_with_no_crash(
        kube: Kube) -> None:
    """The operator's side of a routine week at backoffLimit 3, against the emulator: each eviction of
    the train pod is followed by the controller's exit 76 and restart (what a run that lost its train
    worker does: tests/runtime/test_ray_member_loss.py resumes one to the uninterrupted weights); a rollout
    pod is drained mid-run; then the controller reports the run finished."""
    api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(kube.server.url).rstrip("/")))
    async with kube.operator():
        await kube.create_job(NS, "alpha", {"rollout": {"replicas": 2, "maxReplicas": 2},
                                            "failurePolicy": {"backoffLimit": LIMIT}})
        await kube.settle()
        for _ in range(4):
            await kube.cluster.evict(NS, "alpha-train-0")
            await kube.settle()
            await kube.cluster.restart(NS, "alpha-controller-0", MEMBER_LOST_EXIT_CODE, "Error")
            await kube.settle()
        await kube.cluster.evict(NS, "alpha-rollout-1")
        await kube.settle()
        job = kube.job(NS, "alpha") or {}
        failures = job["status"]["failures"]
        assert (failures["crashes"], failures["preemptions"], failures["restarts"]) == (0, 5, 4)
        assert job["status"]["phase"] == "Running" and kube.condition(NS, "alpha", "Failed")["status"] == "False"
        row = {"step": 4, "epoch": 2, "policy_version": 4, "reward_mean": 0.5}
        await asyncio.to_thread(report, api, NS, "alpha", row, finished=True)
        await kube.settle()
    job = kube.job(NS, "alpha") or {}
    assert job["status"]["phase"] == "Succeeded" and job["status"]["failures"]["crashes"] == 0
    api.close()
