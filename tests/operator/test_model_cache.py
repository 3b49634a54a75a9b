"""A job's shared model cache (spec.model.cache), as the spec and the rendered pods say it: the claim is
mounted read-write in the fetch step of every pod that reads the model, which fetches onto it, and
read-only in the role's container, which reads the model there; the node's disk holds no model, so no
allowance is requested for it; the cache folder is a function of the source text alone."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from jobs import make_job
from pydantic import ValidationError

from rhymerl.api import RLJob
from rhymerl.api.sources import CACHE_ROOT, cache_key, cache_lock, cached_model, parse
from rhymerl.operator.manifests import desired
from rhymerl.operator.manifests.spec_config import spec_yaml
from rhymerl.operator.manifests.storage import DATA_ALLOWANCE_GI

MODEL = "hf://Qwen/Qwen2.5-0.5B-Instruct"
CACHED = {"model": {"path": MODEL, "cache": {"claim": "models"}}, "data": {"source": "s3://prompts/math.jsonl"},
          "reward": {"replicas": 1}}
CLAIM_VOLUME = {"name": "model-cache", "persistentVolumeClaim": {"claimName": "models"}}


_job = partial(make_job, {"metadata": {"name": "j", "namespace": "ns"}}, base="defaults")


def _pods(job: RLJob) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]["spec"]
            for o in desired(job, None) if o["kind"] == "StatefulSet"}


def _mounts(container: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [m for m in container["volumeMounts"] if m["name"] == name]


def _source(text: str) -> Any:
    source = parse(text, file=False)
    assert source is not None
    return source


def test_the_cache_key_is_the_same_for_the_same_source_text_and_differs_for_another_revision() -> None:
    key = cache_key(_source(MODEL))
    assert key == cache_key(_source(MODEL))
    assert key.startswith("hf-Qwen2.5-0.5B-Instruct-")
    assert cache_key(_source(f"{MODEL}@v2")) != key
    assert cache_key(_source("s3://models/Qwen2.5-0.5B-Instruct")) != key
    assert cached_model(CACHE_ROOT, _source(MODEL)) == f"{CACHE_ROOT}/{key}"
    assert cache_lock(CACHE_ROOT, _source(MODEL)) == f"{CACHE_ROOT}/{key}.lock"


def test_a_key_keeps_only_safe_characters_of_the_name() -> None:
    key = cache_key(_source("s3://bucket/a/..x y+z"))
    assert "/" not in key and " " not in key and "+" not in key
    assert not key.removeprefix("s3-").startswith(".")


def test_the_fetch_step_writes_the_claim_and_the_role_reads_it_read_only_in_each_pod_that_reads_the_model() -> None:
    pods = _pods(_job(CACHED))
    for role in ("controller", "rollout", "train"):
        pod = pods[role]
        assert CLAIM_VOLUME in pod["volumes"]
        fetch = pod["initContainers"][0]
        assert _mounts(fetch, "model-cache") == [{"name": "model-cache", "mountPath": CACHE_ROOT}]
        assert fetch["args"][fetch["args"].index("--model-cache") + 1] == CACHE_ROOT
        assert _mounts(pod["containers"][0], "model-cache") == [
            {"name": "model-cache", "mountPath": CACHE_ROOT, "readOnly": True}]
    for role in ("reward", "history"):  # they read the data file only
        assert all(v["name"] != "model-cache" for v in pods[role]["volumes"])
        assert "--model-cache" not in pods[role]["initContainers"][0]["args"]


def test_the_pods_spec_names_the_model_on_the_cache_claim_and_no_cache_left_to_check() -> None:
    text = spec_yaml(_job(CACHED))
    assert f"path: {CACHE_ROOT}/{cache_key(_source(MODEL))}\n" in text
    assert "claim: models" not in text  # the pods' loader would refuse a cache beside a path


def test_a_rollout_pod_with_a_cache_requests_no_model_allowance_only_the_data_files() -> None:
    rollout = _pods(_job(CACHED))["rollout"]
    size = f"{DATA_ALLOWANCE_GI}Gi"
    assert {"name": "data", "emptyDir": {"sizeLimit": size}} in rollout["volumes"]
    assert rollout["containers"][0]["resources"]["requests"]["ephemeral-storage"] == size


def test_a_rollout_pod_that_fetches_only_a_cached_model_reserves_no_disk() -> None:
    rollout = _pods(_job({"model": CACHED["model"]}))["rollout"]
    assert {"name": "data", "emptyDir": {}} in rollout["volumes"]
    assert "ephemeral-storage" not in rollout["containers"][0]["resources"]["requests"]


def test_a_job_without_a_cache_mounts_no_cache_claim() -> None:
    for pod in _pods(_job(f"model.path={MODEL}")).values():
        assert all(v["name"] != "model-cache" for v in pod["volumes"])
        assert all("--model-cache" not in c["args"] for c in pod.get("initContainers", []))


@pytest.mark.parametrize("claim", ["Models", "models_1", "-models", "", "a" * 254])
def test_a_cache_claim_that_is_not_a_dns1123_name_is_refused_naming_the_field(claim: str) -> None:
    with pytest.raises(ValidationError) as refused:
        RLJob.model_validate({"spec": {"model": {"path": MODEL, "cache": {"claim": claim}}}})
    assert [e["loc"][-3:] for e in refused.value.errors()] == [("model", "cache", "claim")]


def test_a_cache_for_a_model_read_in_place_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"cache: only for a fetched model"):
        RLJob.model_validate({"spec": {"model": {"path": "builtin:tiny-arith", "cache": {"claim": "models"}}}})



def test_a_users_volume_or_mount_where_the_cache_goes_is_refused_naming_the_field() -> None:
    claim = {"name": "model-cache", "persistentVolumeClaim": {"claimName": "x"}}
    with pytest.raises(ValidationError, match=r"model-cache is one of the operator's volumes"):
        RLJob.model_validate({"spec": {"rollout": {"pod": {"volumes": [claim]}}}})
    mine = {"name": "mine", "persistentVolumeClaim": {"claimName": "x"}}
    with pytest.raises(ValidationError, match=rf"mountPath: {CACHE_ROOT} is where the operator mounts"):
        RLJob.model_validate({"spec": {"rollout": {"pod": {"volumes": [mine], "volume_mounts": [
            {"name": "mine", "mountPath": CACHE_ROOT}]}}}})
