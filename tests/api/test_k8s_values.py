"""Kubernetes' own value rules in the spec (rhymerl/api/k8s_values.py): what the API server or a
kubelet would refuse is a spec error naming the field, its line and the rule."""

from __future__ import annotations

import pytest

from rhymerl.api import SpecError, parse_job
from rhymerl.api.k8s_values import (
    dns1123_label,
    dns1123_subdomain,
    image,
    label_value,
    qualified_name,
    quantity,
)

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
