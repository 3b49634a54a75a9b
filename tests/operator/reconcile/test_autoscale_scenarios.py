"""Autoscaling on spot against the in-process Kubernetes, with the operator's clock forced (never a sleep): the
controller's fleet-size recommendation (reported as the controller pod reports it) moves the rollout StatefulSet
within the bounds, max_step at a time and once per cooldown, while spot preemptions are replaced and count no
failure; when spot capacity runs out the job goes on with the pods it has and says capacity is short."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import kmock
import kubernetes.client
import pytest
from operator_harness import Kube

from rhymerl.operator.progress import report, report_pods_in_use

pytestmark = pytest.mark.asyncio
NS = "team-a"
SPOT = {"enabled": True, "node_selector": {"cloud.google.com/gke-spot": "true"}}
ROLLOUT = {"replicas": 2, "min_replicas": 1, "max_replicas": 6, "spot": SPOT,
           "autoscaling": {"enabled": True, "cooldown_seconds": 300, "max_step": 2}}


class Clock:
    def __init__(self) -> None:
        self.now = "2026-11-26T10:00:00Z"

    def __call__(self) -> str:
        return self.now


@pytest.fixture
def api(kube: Kube) -> Iterator[kubernetes.client.ApiClient]:
    client = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(kube.server.url).rstrip("/")))
    yield client
    client.close()


async def recommend(api: kubernetes.client.ApiClient, workers: int) -> None:
    """The controller pod's report after a step (workers/controller/fleet.py's recommendation)."""
    row = {"step": 1, "fleet_recommended": workers}
    await asyncio.to_thread(report, api, NS, "alpha", row, now=datetime(2026, 11, 26, tzinfo=UTC))


def rollout_replicas(kube: Kube) -> int:
    found = kube.server.current(kmock.resource("apps/v1/statefulsets"), NS, "alpha-rollout")
    assert found is not None
    return int(found["spec"]["replicas"])


def job_status(kube: Kube) -> dict[str, Any]:
    found: dict[str, Any] = (kube.job(NS, "alpha") or {}).get("status") or {}
    return found


async def test_a_recommendation_moves_spot_rollout_pods_within_bounds_and_preemptions_count_no_failure(
        kube: Kube, api: kubernetes.client.ApiClient) -> None:
    clock = Clock()
    async with kube.operator() as run:
        run.op.now = clock
        await kube.create_job(NS, "alpha", {"rollout": ROLLOUT})
        await kube.settle()
        assert rollout_replicas(kube) == 2
        await recommend(api, 9)  # past max_replicas 6
        await kube.settle()
        assert rollout_replicas(kube) == 4  # 2 + max_step
        assert job_status(kube)["autoscaling"]["lastScaleTime"] == "2026-11-26T10:00:00Z"
        for victim in ("alpha-rollout-1", "alpha-rollout-3"):
            await kube.cluster.preempt(NS, victim)
        # a node the cluster autoscaler removes: its pod is deleted with no DisruptionTarget; the taint says why
        await kube.cluster.taint_node_of(NS, "alpha-rollout-2", "ToBeDeletedByClusterAutoscaler")
        await kube.cluster.request("DELETE", kube.cluster.path("v1/pods", NS, "alpha-rollout-2"))
        await kube.settle()
        assert len(kube.cluster.pods(NS, "alpha", "rollout")) == 4  # replaced
        assert "node node-of-alpha-rollout-2 has the taint ToBeDeletedByClusterAutoscaler" in \
            job_status(kube)["failures"]["lastFailure"]
        clock.now = "2026-11-26T10:04:59Z"  # within the cooldown
        await run.resync()
        await kube.settle()
        assert rollout_replicas(kube) == 4
        assert "cooldown until 2026-11-26T10:05:00Z" in job_status(kube)["autoscaling"]["message"]
        clock.now = "2026-11-26T10:05:00Z"
        await run.resync()
        await kube.settle()
        assert rollout_replicas(kube) == 6  # the bound, not the 9 recommended
        assert len(kube.cluster.pods(NS, "alpha", "rollout")) == 6
        await recommend(api, 1)
        clock.now = "2026-11-26T10:10:00Z"
        await kube.settle()
        assert job_status(kube)["autoscaling"]["replicas"] == 4  # down by max_step, what the controller reads
        assert rollout_replicas(kube) == 6  # held while the controller moves its workers off pods 4 and 5
        draining = kube.condition(NS, "alpha", "Draining")
        assert (draining["status"], draining["lastTransitionTime"]) == ("True", "2026-11-26T10:10:00Z")
        await asyncio.to_thread(report_pods_in_use, api, NS, "alpha", 5)  # one of the two still holds samples
        await kube.settle()
        assert rollout_replicas(kube) == 6
        await asyncio.to_thread(report_pods_in_use, api, NS, "alpha", 4)
        await kube.settle()
        assert rollout_replicas(kube) == 4  # drained: the highest ordinals go, holding no sample
        assert kube.condition(NS, "alpha", "Draining")["reason"] == "Drained"
        assert [p["metadata"]["name"] for p in kube.cluster.pods(NS, "alpha", "rollout")] == [
            f"alpha-rollout-{i}" for i in range(4)]
    failures = job_status(kube)["failures"]
    assert (failures["preemptions"], failures["crashes"]) == (3, 0)
    assert job_status(kube)["phase"] == "Running"
    assert kube.condition(NS, "alpha", "Failed")["status"] == "False"


async def test_when_spot_capacity_runs_out_the_job_goes_on_with_what_it_has_and_holds_its_scale_up(
        kube: Kube, api: kubernetes.client.ApiClient) -> None:
    clock = Clock()
    kube.cluster.capacity["rollout"] = 3  # the spot pool holds three rollout pods
    async with kube.operator() as run:
        run.op.now = clock
        await kube.create_job(NS, "alpha", {"rollout": ROLLOUT})
        await kube.settle()
        await recommend(api, 6)
        await kube.settle()
        assert rollout_replicas(kube) == 4
        short = kube.condition(NS, "alpha", "RolloutReady")
        assert (short["status"], short["reason"]) == ("False", "CapacityShort")
        assert short["message"] == "3/4 rollout pods ready; 1 wait for a node (alpha-rollout-3): the job goes on with 3"
        assert job_status(kube)["phase"] == "Running"
        clock.now = "2026-11-26T11:00:00Z"  # long past the cooldown
        await run.resync()
        await kube.settle()
        assert rollout_replicas(kube) == 4  # no more asked of a pool that has none
        assert "holding while 1 rollout pods wait for a node" in job_status(kube)["autoscaling"]["message"]
        await recommend(api, 3)
        await asyncio.to_thread(report_pods_in_use, api, NS, "alpha", 3)  # the controller drained pod 3
        await kube.settle()
        writes = len(kube.operator_writes())
        await run.resync()
        assert kube.operator_writes()[writes:] == []  # a pass with nothing changed writes nothing
        assert rollout_replicas(kube) == 3
        assert kube.condition(NS, "alpha", "RolloutReady")["reason"] == "AllReplicasReady"
        await asyncio.to_thread(report_pods_in_use, api, NS, "alpha", 2)
        await kube.cluster.request("PATCH", kube.cluster.path("rhymerl.io/v1alpha1/rljobs", NS, "alpha"),
                                   {"spec": {"rollout": {"autoscaling": {"enabled": False}}}})
        await kube.settle()
    assert rollout_replicas(kube) == 2  # spec.rollout.replicas again
    assert "autoscaling" not in job_status(kube)
