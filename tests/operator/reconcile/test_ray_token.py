"""The job's Ray token Secret, as the operator keeps it: created on the first pass, owned by the job,
and never written again, so the running pods keep the token they started with."""

from __future__ import annotations

import kmock
import pytest
from operator_harness import Kube

pytestmark = pytest.mark.asyncio
NS = "team-a"
SECRETS = "v1/secrets"


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


async def test_a_token_that_exists_is_left_as_it_is(kube: Kube) -> None:
    await kube.cluster.request("POST", f"/api/v1/namespaces/{NS}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "alpha-ray-token", "namespace": NS},
        "stringData": {"token": "kept"}})
    async with kube.operator():
        await kube.create_job(NS, "alpha")
        await kube.settle()
    secret = kube.server.current(kmock.resource(SECRETS), NS, "alpha-ray-token")
    assert secret is not None and secret["stringData"] == {"token": "kept"}
    assert kube.children(NS, "alpha")  # the job still got its children: the 409 is no refusal
    assert kube.condition(NS, "alpha", "Degraded").get("status") != "True"
