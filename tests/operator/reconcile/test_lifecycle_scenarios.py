"""The lifecycle against the in-process Kubernetes, with the operator's clock forced (never a sleep):
suspend waits for the controller's checkpoint (the bounded wait's expiry: test_lifecycle.py); the active deadline fails a job;
a finished (here: failed) job goes after its time to live; a Kueue-queued job's pods form one pod group, held until
Kueue admits it whole."""

from __future__ import annotations

from typing import Any

import kmock
import pytest
from operator_harness import Kube, eventually

from rhymerl.operator.manifests.labels import KUEUE_GROUP_LABEL, KUEUE_QUEUE_LABEL, KUEUE_TOTAL_ANNOTATION

pytestmark = pytest.mark.asyncio
NS = "team-a"
RLJOBS = "rhymerl.io/v1alpha1/rljobs"
T0 = "2026-11-26T10:00:00Z"


class Clock:
    """The operator's clock: `now` until a test moves it."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> str:
        return self.now


def replicas(kube: Kube, name: str = "alpha") -> dict[str, int]:
    out = {}
    for role in ("controller", "rollout", "train", "history"):
        found = kube.server.current(kmock.resource("apps/v1/statefulsets"), NS, f"{name}-{role}")
        assert found is not None
        out[role] = int(found["spec"]["replicas"])
    return out


async def patch_job(kube: Kube, patch: dict[str, Any], sub: str | None = None) -> None:
    await kube.cluster.request("PATCH", kube.cluster.path(RLJOBS, NS, "alpha", sub), patch)


async def test_suspend_stops_the_controller_first_and_the_other_roles_only_once_its_pod_is_gone(kube: Kube) -> None:
    clock = Clock()  # the wait's end (lifecycle.suspension; its expiry: test_lifecycle.py) is read from it
    async with kube.operator() as run:
        run.op.now = clock
        await kube.create_job(NS, "alpha")
        await kube.settle()
        kube.cluster.lingering.add("alpha-controller-0")  # SIGTERM'd: finishing its step, until the test says
        await patch_job(kube, {"spec": {"suspend": True}})
        await kube.settle()
        assert replicas(kube) == {"controller": 0, "rollout": 1, "train": 1, "history": 1}
        assert len(kube.cluster.pods(NS, "alpha")) == 4  # the controller's, terminating, and the rest running
        pending = kube.condition(NS, "alpha", "Suspended")
        assert (pending["status"], pending["reason"]) == ("True", "CheckpointPending")
        assert "or at 2026-11-26T10:16:00Z (its grace period controller.termination_grace_seconds 900 s" \
               in pending["message"]
        await kube.cluster.stopped(NS, "alpha-controller-0")  # it checkpointed and exited: gone
        await kube.settle()
        assert replicas(kube) == {"controller": 0, "rollout": 0, "train": 0, "history": 0}
        assert kube.cluster.pods(NS, "alpha") == []
        assert kube.condition(NS, "alpha", "Suspended")["reason"] == "Suspended"
        assert (kube.job(NS, "alpha") or {})["status"]["phase"] == "Suspended"


async def test_a_job_past_its_active_deadline_fails_releasing_its_pods_and_goes_after_its_time_to_live(
        kube: Kube) -> None:
    clock = Clock()
    async with kube.operator() as run:
        run.op.now = clock
        await kube.create_job(NS, "alpha", {"active_deadline_seconds": 600, "ttl_seconds_after_finished": 60})
        await kube.settle()
        clock.now = "2026-11-26T10:09:59Z"
        await run.resync()
        assert (kube.job(NS, "alpha") or {})["status"]["phase"] == "Running"
        clock.now = "2026-11-26T10:10:00Z"
        await run.resync()
        await kube.settle()
        failed = kube.condition(NS, "alpha", "Failed")
        assert (failed["status"], failed["reason"]) == ("True", "DeadlineExceeded")
        assert replicas(kube) == {"controller": 0, "rollout": 0, "train": 0, "history": 0}
        assert kube.cluster.pods(NS, "alpha") == []
        clock.now = "2026-11-26T10:10:59Z"
        await run.resync()
        assert kube.job(NS, "alpha") is not None
        clock.now = "2026-11-26T10:11:00Z"
        await run.resync()
        await eventually(lambda: kube.job(NS, "alpha") is None, what="the job to go")
        await kube.settle()
    assert kube.children(NS, "alpha") == []
    assert "TTLExpired" in [e["reason"] for e in kube.cluster.events(NS, "alpha")]


async def test_a_kueue_queued_job_is_one_pod_group_held_until_admitted_whole(kube: Kube) -> None:
    body = {"apiVersion": "rhymerl.io/v1alpha1", "kind": "RLJob",
            "metadata": {"name": "alpha", "namespace": NS, "labels": {KUEUE_QUEUE_LABEL: "team-a-queue"}},
            "spec": {"rollout": {"replicas": 2, "minReplicas": 2, "maxReplicas": 2}}}
    async with kube.operator():
        await kube.cluster.request("POST", kube.cluster.path(RLJOBS, NS), body)
        await kube.settle()
        for sts in kube.server.live("statefulsets", NS):
            meta = sts["spec"]["template"]["metadata"]
            assert (meta["labels"][KUEUE_QUEUE_LABEL], meta["labels"][KUEUE_GROUP_LABEL]) == ("team-a-queue", "alpha")
            assert meta["annotations"][KUEUE_TOTAL_ANNOTATION] == "5"  # 1 controller, 2 rollout, 1 train, 1 history
        assert len(kube.cluster.pods(NS, "alpha")) == 5
        job = kube.job(NS, "alpha") or {}
        assert job["status"]["phase"] == "Pending"
        ready = kube.condition(NS, "alpha", "Ready")
        assert ready["reason"] == "SchedulingGated" and ready["message"].startswith("5 pods wait for their scheduling")
        assert kube.condition(NS, "alpha", "Degraded")["status"] == "False"  # waiting in a queue is no fault
        await kube.cluster.admit(NS, "alpha")  # checks the group is complete: 5 pods, total-count 5
        await kube.settle()
        assert (kube.job(NS, "alpha") or {})["status"]["phase"] == "Running"
        assert (kube.job(NS, "alpha") or {})["status"]["failures"]["crashes"] == 0
