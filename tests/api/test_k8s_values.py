"""Kubernetes' own value rules in the spec (rhymerl/api/k8s_values.py): what the API server or a
kubelet would refuse is a spec error naming the field, its line and the rule."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from jobs import make_job

from rhymerl.api import RLJob, SpecError, dump_job, parse_job
from rhymerl.api.k8s_values import (
    MAX_CONFIG_MAP_BYTES,
    config_map_key,
    dns1123_label,
    dns1123_subdomain,
    env_var_name,
    image,
    label_value,
    qualified_name,
    quantity,
    yaml_bytes_bound,
)
from rhymerl.api.load import LOCALIZED_SLACK_BYTES, size_problems

HEAD = "apiVersion: rhymerl.io/v1alpha1\nkind: RLJob\n"


def problem(body: str) -> tuple[str, str, int | None]:
    with pytest.raises(SpecError) as info:
        parse_job(HEAD + body)
    (p,) = info.value.problems
    return p.path, p.reason, p.line


@pytest.mark.parametrize(("body", "path", "rule", "line"), [
    ("metadata: {namespace: RL}\n", "metadata.namespace", "IsDNS1123Label", 3),
    ("metadata: {namespace: a/b}\n", "metadata.namespace", "IsDNS1123Label", 3),
    (f"metadata: {{namespace: {'a' * 64}}}\n", "metadata.namespace", "IsDNS1123Label", 3),
    ("spec:\n  rollout:\n    resources: {cpu: lots}\n", "spec.rollout.resources.cpu", "resource.Quantity", 5),
    ("spec:\n  rollout:\n    resources: {cpu: -4}\n", "spec.rollout.resources.cpu", "resource.Quantity", 5),
    ("spec:\n  train:\n    resources: {memory: 64GB}\n", "spec.train.resources.memory", "'GB' is not a suffix", 5),
    ("spec:\n  train:\n    resources: {memory: '20 Gi'}\n", "spec.train.resources.memory", "resource.Quantity", 5),
    ("spec:\n  images: {rollout: ''}\n", "spec.images.rollout", "image reference", 4),
    ("spec:\n  images: {rollout: 'ghcr.io/x/worker gpu:1'}\n", "spec.images.rollout", "image reference", 4),
    ("spec:\n  checkpoint:\n    storage: {storage_class: Fast SSD}\n", "spec.checkpoint.storage.storage_class",
     "IsDNS1123Subdomain", 5),
    ("spec:\n  checkpoint:\n    storage: {size: 20gb}\n", "spec.checkpoint.storage.size", "resource.Quantity", 5),
])
def test_a_value_kubernetes_refuses_is_named_with_its_line_and_rule(body: str, path: str, rule: str, line: int) -> None:
    where, reason, at = problem(body)
    assert where == path and rule in reason and at == line


def test_keys_of_labels_selectors_and_tolerations_follow_the_qualified_name_rule() -> None:
    where, reason, _ = problem("metadata: {labels: {'team name': a}}\n")
    assert where.startswith("metadata.labels") and "IsQualifiedName" in reason
    where, reason, _ = problem("spec:\n  rollout:\n    spot: {enabled: true, node_selector: {'': 'true'}}\n")
    assert where.startswith("spec.rollout.spot.node_selector") and "IsQualifiedName" in reason
    where, reason, _ = problem("spec:\n  train:\n    tolerations: [{key: 'gpu type', operator: Exists}]\n")
    assert where.startswith("spec.train.tolerations.0.key") and "IsQualifiedName" in reason
    where, reason, _ = problem("metadata: {labels: {team: 'a b'}}\n")
    assert "IsValidLabelValue" in reason


def test_the_rules_by_hand() -> None:
    assert dns1123_label("rl-0") == "rl-0"
    for bad in ("-rl", "rl-", "Rl", "r.l", "", "a" * 64):
        with pytest.raises(ValueError):
            dns1123_label(bad)
    assert dns1123_subdomain("fast.ssd-1") == "fast.ssd-1"
    for bad in ("fast..ssd", "Fast", ".a", "a" * 254):
        with pytest.raises(ValueError):
            dns1123_subdomain(bad)
    for good in ("team", "cloud.google.com/gke-spot", "a_b.C-9", "x" * 63):
        assert qualified_name(good) == good
    for bad in ("", "/a", "a/", "Bad_Prefix/a", "a b", "-a", "x" * 64, "a/b/c"):
        with pytest.raises(ValueError):
            qualified_name(bad)
    assert label_value("") == "" and label_value("true") == "true"
    for bad in ("-x", "x-", "a b", "x" * 64):
        with pytest.raises(ValueError):
            label_value(bad)
    for good in ("500m", "4", "2Gi", "1.5", ".5", "1e9", "1E-3", "64M", "0", "+1", 4, 0, "9223372036854775807",
                 "7Ei", "9.2e18", "9E", "1e-999999999"):
        assert quantity(good) == good
    for bad in ("lots", "-4", "64GB", "20 Gi", "2gi", "1Ki2", "", -1, "1.2.3", True,
                "9223372036854775808", "8Ei", "99999999999999999999Ei", "1e19", "10E", "1e999999999999", 2**63):
        with pytest.raises(ValueError):
            quantity(bad)
    for good in ("python:3.11-slim", "ghcr.io/rhymerl/worker-gpu:0.1.0", "localhost:5000/a/b",
                 "registry.example.com:443/ns/img@sha256:" + "a" * 64, "vllm/vllm-openai:v0.8.0"):
        assert image(good) == good
    for bad in ("", " python", "Python:3", "a b", "ghcr.io/x:", "x:tag with space"):
        with pytest.raises(ValueError):
            image(bad)

    for good in ("PYTHONPATH", "my.env-name", "_x", ".x", "-x", "x..y"):
        assert env_var_name(good) == good
    for bad in ("", ".", "..", "..x", "1X", "A B", "A=B", "Ä"):
        with pytest.raises(ValueError):
            env_var_name(bad)
    assert config_map_key("redis-password") == "redis-password"
    for bad in ("", ".", "..", "..key", "a/b", "a" * 254):
        with pytest.raises(ValueError):
            config_map_key(bad)


@pytest.mark.parametrize(("body", "path", "rule"), [
    ("spec:\n  rollout:\n    pod: {env: [{name: '..x', value: '1'}]}\n", "spec.rollout.pod.env.0.name",
     "IsEnvVarName"),
    ("spec:\n  rollout:\n    pod: {env: [{name: '1X', value: '1'}]}\n", "spec.rollout.pod.env.0.name",
     "pattern"),
    ("spec:\n  train:\n    pod: {env_from: [{prefix: '..', secretRef: {name: s}}]}\n",
     "spec.train.pod.env_from.0.prefix", "IsEnvVarName"),
    ("spec:\n  history: {redis_password_secret: {name: s, key: '..'}}\n", "spec.history.redis_password_secret.key",
     "IsConfigMapKey"),
    ("spec:\n  train:\n    tolerations: [{key: pool, value: 'a b'}]\n", "spec.train.tolerations.0.value",
     "IsValidLabelValue"),
])
def test_a_name_or_value_the_api_server_refuses_in_a_pod_is_named_with_its_rule(body: str, path: str, rule: str) -> None:
    where, reason, _ = problem(body)
    assert where == path and rule in reason


def _annotated(where: str, size: int) -> str:
    values = {f"example.com/a{i}": "x" * 60_000 for i in range(size // 60_000)}
    block = {"metadata": {"annotations": values}} if where == "metadata" else \
        {"spec": {"reward": {"pod": {"annotations": values}}}}
    return yaml.safe_dump(block)


@pytest.mark.parametrize(("where", "path"), [("metadata", "metadata.annotations"),
                                             ("pod", "spec.reward.pod.annotations")])
def test_annotations_past_the_api_servers_256_kib_are_refused_and_just_below_it_accepted(where: str, path: str) -> None:
    where_, reason, _ = problem(_annotated(where, 300_000))
    assert where_ == path and "TotalAnnotationSizeLimitB" in reason
    parse_job(HEAD + _annotated(where, 240_000))


def _env(values: int, size: int) -> dict[str, Any]:
    return {"pod": {"env": [{"name": f"LONG_{i}", "value": "v" * size} for i in range(values)]}}


def test_a_spec_whose_configmap_would_pass_1_mib_is_refused_naming_the_spec() -> None:
    doc = {"spec": {"rollout": _env(20, 30_000), "train": _env(20, 30_000)}}  # 1.2 MB, each role's well below
    with pytest.raises(SpecError) as info:
        make_job(doc, base="defaults")
    [found] = info.value.problems
    assert found.path == "spec" and "ConfigMap" in found.reason and str(MAX_CONFIG_MAP_BYTES >> 20) in found.reason
    just_fits = {"spec": {"rollout": _env(20, 30_000), "train": _env(10, 30_000)}}
    fits = RLJob.model_validate(just_fits)
    assert size_problems(fits) == [] and len(dump_job(fits).encode()) < MAX_CONFIG_MAP_BYTES - LOCALIZED_SLACK_BYTES


def test_a_role_whose_statefulset_would_pass_what_etcd_stores_is_refused_naming_its_overrides() -> None:
    doc = {"spec": {"rollout": _env(26, 30_000)}}  # 780 KB, twice in the StatefulSet; the ConfigMap fits
    with pytest.raises(SpecError) as info:
        make_job(doc, base="defaults")
    [found] = info.value.problems
    assert found.path == "spec.rollout.pod" and "etcd" in found.reason


def test_an_rljob_larger_than_etcd_stores_is_refused_as_a_whole() -> None:
    huge = {"metadata": {"annotations": {}}, "spec": {role: _env(20, 20_000) for role in ("rollout", "train",
                                                                                          "reward", "history")}}
    with pytest.raises(SpecError) as info:
        make_job(huge, base="defaults")
    [found] = info.value.problems
    assert found.path == "(document)" and "etcd" in found.reason


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                     | st.text(max_size=200),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=140), inner,
                                                                                 max_size=4),
                     max_leaves=30)


@given(_JSON)
def test_the_yaml_bound_is_never_below_the_dump(data: Any) -> None:
    assert yaml_bytes_bound(data) >= len(yaml.safe_dump(data, sort_keys=False).encode())


def test_the_yaml_bound_of_a_typical_job_is_far_below_a_configmap_so_validation_dumps_nothing() -> None:
    data = RLJob().model_dump(mode="json", by_alias=True)
    assert yaml_bytes_bound(data) < MAX_CONFIG_MAP_BYTES // 2
