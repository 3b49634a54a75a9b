"""Jobs created under the previous release, stored with that release's CRD defaults (its default image tags
among them, as the API server stores every default at create time), then the operator and the CRD replaced
by this release's: nothing rolls; a scale rolls nothing either; a user's change rolls the job onto the images
it was created with, handing its pods a spec.yaml that release reads."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from operator_harness import Kube

from rhymerl.api import parse_job, placement
from rhymerl.api.crd import crd
from rhymerl.api.placement import WORKER_CPU_IMAGE, WORKER_GPU_IMAGE, ImagesSpec
from rhymerl.api.spec import RLJob, RLJobSpec
from rhymerl.operator.manifests import containers
from rhymerl.operator.manifests.roles import SPEC_FILE

pytestmark = pytest.mark.asyncio
NS = "team-a"
RLJOBS = "rhymerl.io/v1alpha1/rljobs"
OLD = "0.0.9"
JOBS = ("alpha", "beta")


def _rebuild() -> None:
    for model in (ImagesSpec, RLJobSpec, RLJob):
        model.model_rebuild(force=True)


@contextlib.contextmanager
def release(tag: str) -> Iterator[None]:
    """This code as the release whose images carry `tag`: its spec's defaults (so its spec hash, its CRD)
    and its builders' default images."""
    cpu, gpu = (f"{image.rpartition(':')[0]}:{tag}" for image in (WORKER_CPU_IMAGE, WORKER_GPU_IMAGE))
    fields = ImagesSpec.model_fields
    saved = {role: fields[role].default for role in ("controller", "reward", "history")}
    with pytest.MonkeyPatch.context() as patch:
        for module in (placement, containers):
            patch.setattr(module, "WORKER_CPU_IMAGE", cpu)
            patch.setattr(module, "WORKER_GPU_IMAGE", gpu)
        try:
            for role in saved:
                fields[role].default = cpu
            _rebuild()
            yield
        finally:
            for role, value in saved.items():
                fields[role].default = value
            _rebuild()


def _running(kube: Kube) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    templates = {s["metadata"]["name"]: copy.deepcopy(s["spec"]["template"]) for s in kube.server.live("statefulsets", NS)}
    data = {c["metadata"]["name"]: dict(c["data"]) for c in kube.server.live("configmaps", NS)}
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for job in JOBS for p in kube.cluster.pods(NS, job)}
    return templates, data, pods


def _images(kube: Kube, job: str) -> set[str]:
    return {c["image"] for p in kube.cluster.pods(NS, job) for c in p["spec"]["containers"]}


async def _created_under_the_old_release(kube: Kube) -> None:
    with release(OLD):
        kube.server.install_crd(crd())
        async with kube.operator():
            await kube.create_job(NS, "alpha")
            await kube.create_job(NS, "beta", {"rollout": {"replicas": 2, "max_replicas": 3}})
            await kube.settle()
    images = (kube.job(NS, "alpha") or {})["spec"]["images"]  # the API server stored the old defaults
    assert {images[r] for r in ("controller", "reward", "history")} == {f"ghcr.io/rhymerl/worker-cpu:{OLD}"}
    assert all(i.endswith(f":{OLD}") for job in JOBS for i in _images(kube, job))
    kube.server.install_crd(crd())  # helm upgrade: this release's CRD, then its operator


async def test_an_upgrade_writes_no_template_and_no_spec_yaml_and_restarts_no_pod(kube: Kube) -> None:
    await _created_under_the_old_release(kube)
    before = _running(kube)
    writes = len(kube.operator_writes())
    async with kube.operator() as run:
        await run.resync()
        await kube.settle()
        assert _running(kube) == before
        assert not [w for w in kube.operator_writes()[writes:] if "/statefulsets/" in w or "/configmaps/" in w]
        assert [(kube.job(NS, j) or {})["status"]["phase"] for j in JOBS] == ["Running", "Running"]
        await kube.cluster.request("PATCH", kube.cluster.path(RLJOBS, NS, "beta") + "/scale",
                                   {"spec": {"replicas": 3}})  # a new generation that changes no pod
        await kube.settle()
    templates, data, pods = _running(kube)
    assert (kube.job(NS, "beta") or {})["metadata"]["generation"] == 2
    assert (templates, data) == before[:2]
    assert {k: v for k, v in pods.items() if k != "beta-rollout-2"} == before[2]


async def test_a_users_change_after_an_upgrade_rolls_the_job_on_its_release_with_a_spec_yaml_it_reads(
        kube: Kube) -> None:
    await _created_under_the_old_release(kube)
    before = _running(kube)
    async with kube.operator():
        await kube.cluster.request("PATCH", kube.cluster.path(RLJOBS, NS, "alpha"),
                                   {"spec": {"rollout": {"temperature": 0.7}}})
        await kube.settle()
    after = _running(kube)
    assert after[2]["alpha-controller-0"] != before[2]["alpha-controller-0"]  # the change rolled the job
    assert {i.rpartition(":")[2] for i in _images(kube, "alpha")} == {OLD}  # one Ray version, the job's
    text = after[1]["alpha-spec"][SPEC_FILE]
    old_image = f"ghcr.io/rhymerl/worker-cpu:{OLD}"
    assert yaml.safe_load(text)["spec"] == {  # only what differs from this release's defaults
        "images": {"controller": old_image, "reward": old_image, "history": old_image},
        "rollout": {"temperature": 0.7}}
    stored = {"metadata": {"name": "alpha", "namespace": NS}, "spec": (kube.job(NS, "alpha") or {})["spec"]}
    with release(OLD):  # the old release's loader reads it as the job the user has
        assert parse_job(text).spec == RLJob.model_validate(stored).spec
    assert after[1]["beta-spec"] == before[1]["beta-spec"]
