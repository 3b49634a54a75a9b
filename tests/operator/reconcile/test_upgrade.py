"""An operator upgrade restarts no job: the pod templates and the spec.yaml a job's pods run from change
only when the user's spec does (diff.pinned), whatever the new release's builders render, and however the
stored object spells its fields (the snake_case CRD's, or camelCase)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest
from operator_harness import Kube

from rhymerl.api.crd import crd
from rhymerl.api.spec import RLJob
from rhymerl.api.spelling import camel_keys
from rhymerl.operator.manifests import SPEC_HASH_ANNOTATION, spec_hash, workloads
from rhymerl.operator.manifests.pods import pod_template
from rhymerl.operator.reconcile.diff import APPLIED, Source, pinned
from rhymerl.workers.runtime.ray_network import AUTH_MODE_ENV, TOKEN_PATH_ENV

NS = "team-a"
RLJOBS = "rhymerl.io/v1alpha1/rljobs"
_CURRENT = pod_template


def _without_ray_token(job: Any, role: Any, digest: str) -> dict[str, Any]:
    """The pod template of the release before the Ray token: the current one less its volume, mount and
    environment (what that release's builders rendered for the same spec)."""
    out = copy.deepcopy(_CURRENT(job, role, digest))
    spec = out["spec"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "ray-token"]
    for c in spec["containers"]:
        c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "ray-token"]
        c["env"] = [e for e in c["env"] if e["name"] not in (AUTH_MODE_ENV, TOKEN_PATH_ENV)]
    return out


def _running(kube: Kube) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    templates = {s["metadata"]["name"]: copy.deepcopy(s["spec"]["template"]) for s in kube.server.live("statefulsets", NS)}
    data = {c["metadata"]["name"]: dict(c["data"]) for c in kube.server.live("configmaps", NS)}
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kube.cluster.pods(NS, "alpha")}
    return templates, data, pods


def test_a_field_a_release_adds_with_its_default_does_not_move_the_spec_hash() -> None:
    base = {"metadata": {"name": "alpha"}, "spec": {"algorithm": {"lr": 1e-5}}}
    spelled = {"metadata": {"name": "alpha"}, "spec": {"algorithm": {"lr": 1e-5},
                                                       "rollout": {"speculation": {"group_drafts": True}}}}
    assert spec_hash(RLJob.model_validate(base)) == spec_hash(RLJob.model_validate(spelled))  # as the API server defaults it
    changed = {"metadata": {"name": "alpha"}, "spec": {"algorithm": {"lr": 2e-5}}}
    assert spec_hash(RLJob.model_validate(changed)) != spec_hash(RLJob.model_validate(base))


def test_the_spec_hash_reads_snake_case_field_names_so_the_camel_case_crd_restarts_no_job() -> None:
    """Jobs started before the CRD served camelCase keep their hash: it hashes the fields by name, however
    the object spells them."""
    camel = {"metadata": {"name": "alpha"}, "spec": {"data": {"numPrompts": 64}, "rollout": {"topP": 0.5}}}
    snake = {"metadata": {"name": "alpha"}, "spec": {"data": {"num_prompts": 64}, "rollout": {"top_p": 0.5}}}
    before = hashlib.sha256(b'{"data":{"num_prompts":64},"rollout":{"top_p":0.5}}').hexdigest()[:16]
    assert spec_hash(RLJob.model_validate(camel)) == spec_hash(RLJob.model_validate(snake)) == before


@pytest.mark.asyncio
async def test_an_upgraded_operator_writes_no_pod_template_until_the_user_changes_the_spec(
        kube: Kube, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workloads, "pod_template", _without_ray_token)
    kube.server.install_crd(crd(transition=True))  # keeps the snake_case job as the snake_case CRD stored it
    async with kube.operator():
        await kube.create_job(NS, "alpha", {"algorithm": {"lr": 1e-5, "kl_coef": 0.001}}, respell=False)
        await kube.settle()
    before = _running(kube)
    assert all("ray-token" not in str(t) for t in before[0].values())
    writes = len(kube.operator_writes())
    monkeypatch.undo()  # the upgrade: the current release's builders
    async with kube.operator() as run:
        await run.resync()
        await kube.settle()
        assert _running(kube) == before  # no template, no spec.yaml, no pod changed
        # the job rewritten camelCase under the transition CRD (rhymerl respell - | kubectl replace -f -; here
        # a merge patch to the same end: the emulator has no PUT)
        respelled = camel_keys(RLJob, kube.job(NS, "alpha"))["spec"]["algorithm"]
        assert respelled == {"lr": 1e-5, "klCoef": 0.001}
        await kube.cluster.request("PATCH", kube.cluster.path(RLJOBS, NS, "alpha"),
                                   {"spec": {"algorithm": {**respelled, "kl_coef": None}}})
        await kube.settle()
        assert (kube.job(NS, "alpha") or {})["spec"]["algorithm"] == {"lr": 1e-5, "klCoef": 0.001}
        assert _running(kube) == before
        assert not [w for w in kube.operator_writes()[writes:] if "/statefulsets/" in w or "/configmaps/" in w]
        kube.server.install_crd(crd())  # the camelCase CRD: the job read back defaulted, its pods untouched
        await run.resync()
        await kube.settle()
        assert _running(kube) == before
        await kube.cluster.request("PATCH", kube.cluster.path(RLJOBS, NS, "alpha"), {"spec": {"algorithm": {"lr": 2e-5}}})
        await kube.settle()
    templates, data, _ = _running(kube)
    assert all("ray-token" in str(t) for t in templates.values())  # the user's change brings the new rendering
    assert data != before[1]


def _sts(image: str, digest: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "j-rollout", "labels": {}},
            "spec": {"replicas": 1, "template": {"metadata": {"annotations": {SPEC_HASH_ANNOTATION: digest}},
                                                 "spec": {"containers": [{"name": "rollout", "image": image}]}}}}


def test_pinning_keeps_a_template_at_its_generation_or_for_a_spec_that_hashes_the_same_under_this_release() -> None:
    def source(generation: int, lr: float) -> Source:
        return Source(generation, {"spec": {"algorithm": {"lr": lr}}, "queue": None},
                      lambda recorded: recorded["spec"]["algorithm"]["lr"] == lr)

    live = copy.deepcopy(pinned([_sts("v1", "old-release-hash")], [], source(1, 1e-5))[0])
    def image(objects: list[dict[str, Any]]) -> str:
        return str(objects[0]["spec"]["template"]["spec"]["containers"][0]["image"])

    assert image(pinned([_sts("v2", "new-hash")], [live], source(1, 1e-5))) == "v1"  # the upgrade: same generation
    assert image(pinned([_sts("v2", "new-hash")], [live], source(2, 1e-5))) == "v1"  # a scale: the same spec
    rolled = pinned([_sts("v2", "new-hash")], [live], source(3, 2e-5))[0]  # the user's change
    assert image([rolled]) == "v2"
    assert json.loads(rolled["metadata"]["annotations"][APPLIED])["generation"] == 3
    assert image(pinned([_sts("v2", "new-hash")], [live])) == "v2"  # without a source: the hash alone
