"""The job's Ray token Secret, as the operator keeps it: created on the first pass, owned by the job,
and never written again, so the running pods keep the token they started with; never one the operator
did not create for the job's uid (an earlier job's of the same name that the garbage collector has not
removed yet, a person's), which no pod of the job mounts (operator/reconcile/token.py)."""

from __future__ import annotations

from typing import Any

import kmock
import pytest
from operator_harness import Kube, eventually

from rhymerl.operator.reconcile.token import RECORD

pytestmark = pytest.mark.asyncio
NS = "team-a"
SECRETS = "v1/secrets"
STATEFULSETS = "v1/statefulsets"
POST_SECRET = f"POST /api/v1/namespaces/{NS}/secrets"


def secret(kube: Kube) -> dict[str, Any] | None:
    return kube.server.current(kmock.resource(SECRETS), NS, "alpha-ray-token")


def statefulsets(kube: Kube) -> list[str]:
    return [name for plural, name in kube.children(NS, "alpha") if plural == "statefulsets"]


async def test_the_token_secret_is_created_once_and_not_regenerated_by_later_passes(kube: Kube) -> None:
    async with kube.operator() as run:
        job = await kube.create_job(NS, "alpha")
        await kube.settle()
        secret = kube.server.current(kmock.resource(SECRETS), NS, "alpha-ray-token")
        assert secret is not None
        token = secret["stringData"]["token"]
        assert len(token) == 64 and int(token, 16) >= 0, "256 random bits, as Ray's own generator"
        assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        before = kube.operator_writes()
        await run.resync()
        await run.resync()
        await kube.settle()
        assert run.op.passes >= 3
        assert [w for w in kube.operator_writes()[len(before):] if "/secrets" in w] == []
    writes = [w for w in kube.operator_writes() if "/secrets" in w]
    assert writes == [f"POST /api/v1/namespaces/{NS}/secrets"]
    after = kube.server.current(kmock.resource(SECRETS), NS, "alpha-ray-token")
    assert after is not None and after["stringData"]["token"] == token


async def test_a_job_created_again_waits_for_the_earlier_jobs_token_to_be_collected_then_gets_its_own(
        kube: Kube) -> None:
    async with kube.operator() as run:
        first = await kube.create_job(NS, "alpha")
        old = await eventually(lambda: secret(kube), what="the first job's token")
        await run.idle()  # its children made; no pod yet (Cluster.step plays the StatefulSet controller too)
        assert old["metadata"]["ownerReferences"][0]["uid"] == first["metadata"]["uid"]
        # deleted and created again before the garbage collector (Cluster.step) removes its children
        await kube.cluster.request("DELETE", f"/apis/rhymerl.io/v1alpha1/namespaces/{NS}/rljobs/alpha")
        again = await kube.create_job(NS, "alpha")
        uid = again["metadata"]["uid"]
        waiting = await eventually(lambda: kube.condition(NS, "alpha", "Degraded").get("reason") == "RayTokenPending",
                                   what="the new job to wait for its own token")
        assert waiting
        message = kube.condition(NS, "alpha", "Degraded")["message"]
        assert "alpha-ray-token" in message and uid in message and "garbage collector" in message
        still = secret(kube)
        assert still is not None and still["stringData"] == old["stringData"], "the earlier job's, left as it is"
        assert all(sts["metadata"]["ownerReferences"][0]["uid"] != uid
                   for sts in kube.server.live("statefulsets", NS)), "no pod of the new job mounts the old token"
        await kube.cluster.step()  # the garbage collector removes the earlier job's children, its Secret with them
        await run.resync()
        await kube.settle()
    mine = secret(kube)
    assert mine is not None and mine["metadata"]["ownerReferences"][0]["uid"] == uid
    assert mine["stringData"] != old["stringData"]
    assert len(statefulsets(kube)) == 5 and kube.condition(NS, "alpha", "Degraded").get("reason") != "RayTokenPending"


async def test_a_secret_of_the_tokens_name_the_operator_did_not_create_is_neither_changed_nor_mounted(
        kube: Kube) -> None:
    await kube.cluster.request("POST", f"/api/v1/namespaces/{NS}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "alpha-ray-token", "namespace": NS},
        "stringData": {"token": "kept"}})
    async with kube.operator() as run:
        await kube.create_job(NS, "alpha")
        await kube.settle()
        await run.resync()
        assert statefulsets(kube) == [] and kube.children(NS, "alpha"), "the other children are made; no pod waits"
        assert kube.condition(NS, "alpha", "Degraded").get("reason") == "RayTokenPending"
        held = secret(kube)
        assert held is not None and held["stringData"] == {"token": "kept"}
        await kube.cluster.request("DELETE", f"/api/v1/namespaces/{NS}/secrets/alpha-ray-token")  # its owner's call
        await run.resync()
        await kube.settle()
    assert len(statefulsets(kube)) == 5
    mine = secret(kube)
    assert mine is not None and mine["stringData"]["token"] != "kept"


async def test_a_restarted_operator_knows_the_token_it_created_and_asks_for_none(kube: Kube) -> None:
    async with kube.operator():
        await kube.create_job(NS, "alpha")
        await kube.settle()
    spec = kube.server.current(kmock.resource("v1/configmaps"), NS, "alpha-spec")
    assert spec is not None and spec["metadata"]["annotations"][RECORD]
    before = len(kube.operator_writes())
    async with kube.operator() as run:
        await run.resync()
        await kube.settle()
    assert POST_SECRET not in kube.operator_writes()[before:]
    assert len(statefulsets(kube)) == 5 and kube.condition(NS, "alpha", "Degraded").get("status") != "True"
