"""A job runs the release of rhymerl it was created with, until its spec names other images. Pure.

The API server stores the CRD's defaults in every RLJob when it is created, the default images among
them (spec.images.controller, reward, history: the worker-cpu image of that release); rollout and train
default to no image (the builders pick the CPU or GPU image by the role's needs). After an operator
upgrade, a user's change rolls the job's pods (diff.pinned); without this module the rollout and train
pods would then get the new release's images while the controller keeps the stored old one (one Ray
cluster, two Ray versions), and every pod a spec.yaml the new release writes, which the old images'
strict loader refuses for the fields the new release added. So: the job's release is the tag of the
image its controller runs (as stored, else as the operator last wrote it); a role whose image the
spec does not name gets the image of that tag; and a job on an earlier release gets a spec.yaml
without the fields equal to this release's defaults (a field a release adds is stored as its default,
so it is left out; a default that changed is stored as the old value, so it is kept).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from rhymerl.api import placement as api_placement
from rhymerl.api.placement import ImagesSpec
from rhymerl.api.roles import ROLES
from rhymerl.api.spec import RLJob, RLJobSpec
from rhymerl.operator.manifests.labels import COMPONENT_KEY, KUEUE_QUEUE_LABEL
from rhymerl.operator.manifests.roles import SPEC_FILE
from rhymerl.operator.manifests.spec_config import localized, spec_hash
from rhymerl.operator.reconcile.diff import Source, applied_record
from rhymerl.operator.reconcile.validate import parse

Manifest = dict[str, Any]


def _repo_tag(image: str) -> tuple[str, str]:
    repo, sep, tag = image.rpartition(":")
    return (repo, tag) if sep and "/" not in tag else (image, "")


def _ours() -> dict[str, str]:
    """This release's default images by repository (worker-cpu, worker-gpu)."""
    return {_repo_tag(i)[0]: i for i in (api_placement.WORKER_CPU_IMAGE, api_placement.WORKER_GPU_IMAGE)}


def _tag_of_ours(image: object) -> str | None:
    if not isinstance(image, str):
        return None
    repo, tag = _repo_tag(image)
    return tag if tag and repo in _ours() else None


def _template(sts: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod template the operator last wrote (its APPLIED record), else the live one."""
    record = applied_record(sts)
    body = record["content"] if record is not None else sts.get("spec") or {}
    template = body.get("template")
    return template if isinstance(template, dict) else {}


def _role_image(sts: Mapping[str, Any], role: str) -> str | None:
    for container in (_template(sts).get("spec") or {}).get("containers") or []:
        if container.get("name") == role:
            return str(container.get("image"))
    return None


def job_release(stored_spec: Mapping[str, Any], children: Iterable[Manifest]) -> str | None:
    """The tag of the rhymerl images the job runs: its controller's image as stored in its spec, else as
    its controller StatefulSet runs it; None when neither is one of rhymerl's images."""
    named = ImagesSpec.written(RLJobSpec.written(stored_spec, "images"), "controller")
    if named is not None:
        return _tag_of_ours(named)
    for obj in children:
        if obj.get("kind") == "StatefulSet" and obj["metadata"].get("labels", {}).get(COMPONENT_KEY) == "controller":
            return _tag_of_ours(_role_image(obj, "controller"))
    return None


def _retagged(template: dict[str, Any], tag: str) -> None:
    ours = _ours()
    for key in ("containers", "initContainers"):
        for container in template.get("spec", {}).get(key) or []:
            repo, _ = _repo_tag(str(container.get("image")))
            if container.get("image") in ours.values():
                container["image"] = f"{repo}:{tag}"


def minimal_spec_yaml(job: RLJob) -> str:
    """The job's spec.yaml without the fields equal to this release's defaults (apiVersion, kind and
    metadata always): what an image of another release reads with its own defaults."""
    resolved = localized(job)
    doc = {"apiVersion": resolved.apiVersion, "kind": resolved.kind,
           "metadata": resolved.metadata.model_dump(mode="json", by_alias=True, exclude_defaults=True),
           "spec": resolved.spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)}
    return yaml.safe_dump(doc, sort_keys=False)


def on_its_release(objects: Sequence[Manifest], job: RLJob, stored_spec: Mapping[str, Any],
                   children: Iterable[Manifest]) -> list[Manifest]:
    """`objects` (as this release builds them) for the release the job runs: every image of this
    release's that the spec does not name, at the job's tag; the spec.yaml without this release's
    defaults when that tag is another release's. Unchanged for a job on this release."""
    tag = job_release(stored_spec, children)
    if tag is None or tag == _repo_tag(api_placement.WORKER_CPU_IMAGE)[1]:
        return list(objects)
    images = RLJobSpec.written(stored_spec, "images")
    unnamed = {role for role in ROLES if ImagesSpec.written(images, role) is None}
    out = []
    for obj in objects:
        role = obj["metadata"].get("labels", {}).get(COMPONENT_KEY)
        if obj["kind"] == "StatefulSet" and role in unnamed:
            obj = copy.deepcopy(obj)
            _retagged(obj["spec"]["template"], tag)
        elif obj["kind"] == "ConfigMap" and SPEC_FILE in (obj.get("data") or {}):
            obj = {**obj, "data": {**obj["data"], SPEC_FILE: minimal_spec_yaml(job)}}
        out.append(obj)
    return out


def pin_source(body: Mapping[str, Any], job: RLJob) -> Source:
    """What diff.pinned compares for the RLJob `body` (as read; `job` its validated spec): a recorded spec
    is the same when it hashes as `job` under this release's defaults."""
    meta = body.get("metadata") or {}
    queue = (meta.get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    digest = spec_hash(job)

    def same(recorded: Mapping[str, Any]) -> bool:
        labels = {} if recorded.get("queue") is None else {KUEUE_QUEUE_LABEL: recorded["queue"]}
        then = parse({"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                      "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "labels": labels},
                      "spec": recorded.get("spec")}).job
        return then is not None and spec_hash(then) == digest

    return Source(int(meta.get("generation") or 0), {"spec": copy.deepcopy(body.get("spec")), "queue": queue}, same)
