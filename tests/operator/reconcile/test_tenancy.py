"""The operator never takes over an object it did not make for the job: a person's ConfigMap, or another
job's Service, of the name a child needs is left exactly as it is (a forced server-side apply would
rewrite it and add the job as its owner); the job says whose object is in its way, and goes on once
the name is free (reconciler._converge, Cluster.someone_elses)."""

from __future__ import annotations

import kmock
import pytest
from operator_harness import Kube, eventually

pytestmark = pytest.mark.asyncio
NS = "team-a"
CONFIGMAPS = "v1/configmaps"
THEIRS = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "alpha-spec", "namespace": NS,
                                                                 "labels": {"team": "data"}},
          "data": {"spec.yaml": "mine: true\n"}}


async def test_a_persons_object_of_a_childs_name_is_never_taken_over_and_the_job_says_whose_it_is(
        kube: Kube) -> None:
    await kube.cluster.request("POST", f"/api/v1/namespaces/{NS}/configmaps", THEIRS)
    async with kube.operator() as run:
        job = await kube.create_job(NS, "alpha")
        degraded = await eventually(lambda: kube.condition(NS, "alpha", "Degraded").get("reason") == "ApplyFailed",
                                    what="the job to say a name it needs is taken")
        assert degraded
        message = kube.condition(NS, "alpha", "Degraded")["message"]
        assert "ConfigMap/alpha-spec: exists and is not this job's" in message and "delete or rename it" in message
        theirs = kube.server.current(kmock.resource(CONFIGMAPS), NS, "alpha-spec")
        assert theirs is not None and theirs["data"] == THEIRS["data"]
        assert theirs["metadata"].get("labels") == {"team": "data"}
        assert not theirs["metadata"].get("ownerReferences"), "the job is not made its owner"
        assert not [w for w in kube.operator_writes() if w.startswith("PATCH") and w.endswith("/configmaps/alpha-spec")]
        # the person deletes theirs: the job makes its own and goes on
        await kube.cluster.request("DELETE", f"/api/v1/namespaces/{NS}/configmaps/alpha-spec")
        await run.resync()
        await kube.settle()
    mine = kube.server.current(kmock.resource(CONFIGMAPS), NS, "alpha-spec")
    assert mine is not None and mine["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert kube.condition(NS, "alpha", "Degraded").get("reason") != "ApplyFailed"
