from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rhymerl.api.crd import crd, crd_yaml


def test_committed_crd_equals_the_generator_output(repo: Path) -> None:
    committed = (repo / "crds" / "rljob.yaml").read_text()
    assert committed == crd_yaml(), "crds/rljob.yaml is stale: run `rhymerl crd > crds/rljob.yaml`"


def _walk(node: dict[str, Any], path: str = "") -> list[str]:
    """Paths of nodes that break Kubernetes' structural-schema rules."""
    bad = []
    if "$ref" in node or "anyOf" in node or "allOf" in node:
        bad.append(path)
    if "type" not in node and not node.get("x-kubernetes-int-or-string"):
        bad.append(path)
    for key, sub in node.get("properties", {}).items():
        bad += _walk(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        bad += _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        bad += _walk(node["additionalProperties"], f"{path}{{}}")
    return bad


def test_the_schema_is_structural() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(schema) == []


def test_scale_subresource_points_at_rollout_replicas() -> None:
    version = crd()["spec"]["versions"][0]
    scale = version["subresources"]["scale"]
    spec_props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert scale == {"specReplicasPath": ".spec.rollout.replicas", "statusReplicasPath": ".status.replicas",
                     "labelSelectorPath": ".status.selector"}
    assert spec_props["rollout"]["properties"]["replicas"]["type"] == "integer"
    assert "status" in version["subresources"]


def test_printer_columns_show_phase_step_reward_acceptance_age_and_more_with_wide_output() -> None:
    columns = crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    default = [(c["name"], c["jsonPath"]) for c in columns if not c.get("priority")]
    assert default == [("Phase", ".status.phase"), ("Step", ".status.progress.step"),
                       ("Reward", ".status.progress.rewardMean"), ("Acceptance", ".status.progress.acceptanceRate"),
                       ("Age", ".metadata.creationTimestamp")]
    assert {c["name"] for c in columns if c.get("priority") == 1} == {"Epoch", "Rollout", "Desired", "Suspended"}


def test_enums_and_bounds_reach_the_schema() -> None:
    props = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    algo = props["algorithm"]["properties"]
    assert algo["name"]["enum"] == ["grpo", "dapo"]
    assert algo["groupSize"]["minimum"] == 0 and algo["groupSize"]["exclusiveMinimum"] is True
    assert props["rollout"]["properties"]["resources"]["properties"]["cpu"]["x-kubernetes-int-or-string"]
    assert yaml.safe_load(crd_yaml())["kind"] == "CustomResourceDefinition"
