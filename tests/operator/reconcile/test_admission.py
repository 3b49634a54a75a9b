"""A job in a namespace whose admission refuses pods: Pod Security `restricted` runs our pods, and a quota or a
webhook that refuses them is said in the job's status, quoting the API server (the emulator refuses as the
API server does: admission_plugins.py, pod_security.py; the StatefulSet controller records FailedCreate)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from jobs import make_job
from kubernetes.aio.client.exceptions import ApiException
from operator_harness import Kube
from pod_security import ENFORCE_LABEL, restricted_violations

from rhymerl.operator.manifests import Owner, desired
from rhymerl.operator.reconcile.admission import Short, refusals, short
from rhymerl.operator.reconcile.cluster import Cluster

pytestmark = pytest.mark.asyncio
NS = "team-a"
QUOTAS = "v1/resourcequotas"
JOB = {"rollout": {"replicas": 2, "maxReplicas": 2}}
PODS = {"alpha-controller-0", "alpha-history-0", "alpha-rollout-0", "alpha-rollout-1", "alpha-train-0"}  # of JOB


def _pod_names(kube: Kube) -> set[str]:
    return {p["metadata"]["name"] for p in kube.cluster.pods(NS, "alpha")}


def _pod_specs(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    job = make_job({"metadata": {"name": "j", "namespace": NS}, "spec": spec}, base="defaults")
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"]
            for o in desired(job, Owner("rhymerl.io/v1alpha1", "RLJob", "j", "uid")) if o["kind"] == "StatefulSet"}


def _event(pod: str, error: str, when: str, uid: str = "u1") -> dict[str, Any]:
    return {"reason": "FailedCreate", "involvedObject": {"kind": "StatefulSet", "name": "j-rollout", "uid": uid},
            "message": f"create Pod {pod} in StatefulSet j-rollout failed error: {error}", "lastTimestamp": when}


async def test_only_the_latest_refusal_of_a_pod_still_missing_of_this_very_set_is_reported() -> None:
    sts = {"kind": "StatefulSet", "metadata": {"name": "j-rollout", "uid": "u1", "generation": 2},
           "spec": {"replicas": 3}, "status": {"observedGeneration": 2}}
    assert short([{**sts, "status": {"observedGeneration": 1}}], []) == []  # its controller has not acted yet
    shorts = short([sts, {"kind": "Service", "metadata": {"name": "j-rollout", "uid": "s"}}], ["j-rollout-0"])
    assert shorts == [Short("j-rollout", "u1", ("j-rollout-1", "j-rollout-2"))]
    assert "involvedObject.uid=u1" in shorts[0].field_selector() and "reason=FailedCreate" in shorts[0].field_selector()
    events = [_event("j-rollout-1", "new", "2026-01-01T00:00:09Z"), _event("j-rollout-1", "old", "2026-01-01T00:00:01Z"),
              _event("j-rollout-0", "exists now", "2026-01-01T00:00:05Z"),
              _event("j-rollout-2", "an earlier set's", "2026-01-01T00:00:05Z", uid="u0")]
    assert refusals(events, shorts) == ("pod j-rollout-1: new",)
    assert short([sts], ["j-rollout-0", "j-rollout-1", "j-rollout-2"]) == []


async def test_an_operator_that_may_not_list_events_asks_once_and_reports_no_refusal() -> None:
    cluster = Cluster(SimpleNamespace())  # type: ignore[arg-type]
    asked: list[str] = []

    async def forbidden(method: str, path: str, **_: Any) -> Any:
        asked.append(path)
        raise ApiException(status=403, reason="Forbidden")

    cluster._call = forbidden  # type: ignore[method-assign]
    assert await cluster.list_events(NS, "reason=FailedCreate") == []
    assert await cluster.list_events(NS, "reason=FailedCreate") == []
    assert asked == [f"/api/v1/namespaces/{NS}/events"]


@pytest.mark.parametrize("spec", [
    {}, {"rollout": {"replicas": 3, "max_replicas": 3, "resources": {"gpu": 1}}, "train": {"resources": {"gpu": 2}}},
    {"history": {"store": "redis", "redis_url": "redis://r:6379/0"}},
], ids=["defaults", "gpus", "redis-history"])
async def test_every_pod_the_job_renders_passes_pod_security_restricted(spec: dict[str, Any]) -> None:
    """A regression guard: a builder that adds a field `restricted` forbids fails here, naming the rule."""
    specs = _pod_specs(spec)
    assert len(specs) == 5
    assert {name: restricted_violations(s) for name, s in specs.items()} == {name: [] for name in specs}


async def test_a_namespace_enforcing_pod_security_restricted_runs_the_job(kube: Kube) -> None:
    kube.server.label_namespace(NS, {ENFORCE_LABEL: "restricted"})
    async with kube.operator():
        await kube.create_job(NS, "alpha", JOB)
        await kube.settle()
    assert _pod_names(kube) == PODS
    assert (kube.job(NS, "alpha") or {})["status"]["phase"] == "Running"


async def test_a_quota_too_small_is_named_in_the_status_and_raising_it_lets_the_job_run(kube: Kube) -> None:
    await kube.cluster.request("POST", kube.cluster.path(QUOTAS, NS), {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "small", "namespace": NS},
        "spec": {"hard": {"pods": "3"}}})
    async with kube.operator() as running:
        await kube.create_job(NS, "alpha", JOB)
        await kube.settle()
        missing = PODS - _pod_names(kube)
        assert len(missing) == 2  # refused; the StatefulSet controller goes on, nothing crashed
        degraded = kube.condition(NS, "alpha", "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "PodsRefused")
        assert degraded["message"].startswith(f"pod {min(missing)}: pods \"{min(missing)}\" is forbidden: exceeded "
                                              "quota: small, requested: pods=1, used: pods=3, limited: pods=3")
        assert kube.condition(NS, "alpha", "Ready")["reason"] == "PodsRefused"
        assert (kube.job(NS, "alpha") or {})["status"]["phase"] == "Pending"
        gets = running.op.cluster.calls["GET"]
        await running.resync()
        sets = {name.rsplit("-", 1)[0] for name in missing}
        assert running.op.cluster.calls["GET"] - gets == len(sets)  # one list of events per set missing pods

        await kube.cluster.request("PATCH", kube.cluster.path(QUOTAS, NS, "small"), {"spec": {"hard": {"pods": "5"}}})
        await kube.settle()
        assert _pod_names(kube) == PODS
        assert kube.condition(NS, "alpha", "Degraded")["reason"] == "AsExpected"
        assert (kube.job(NS, "alpha") or {})["status"]["phase"] == "Running"
        gets = running.op.cluster.calls["GET"]
        await running.resync()
        assert running.op.cluster.calls["GET"] == gets  # every pod exists: no event is listed


async def test_a_webhooks_denial_is_reported_with_its_message(kube: Kube) -> None:
    def deny_rollout(pod: Any) -> tuple[int, str] | None:
        labels = pod["metadata"].get("labels") or {}
        return (403, "rollout pods need a cost-center label") if \
            labels.get("app.kubernetes.io/component") == "rollout" else None

    kube.server.register_webhook("policy.example.com", deny_rollout)
    async with kube.operator():
        await kube.create_job(NS, "alpha", JOB)
        await kube.settle()
    assert kube.cluster.pods(NS, "alpha", "rollout") == []
    degraded = kube.condition(NS, "alpha", "Degraded")
    assert degraded["reason"] == "PodsRefused"
    assert degraded["message"].startswith('pod alpha-rollout-0: admission webhook "policy.example.com" denied the '
                                          "request: rollout pods need a cost-center label")
