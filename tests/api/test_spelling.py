"""Field names: camelCase in the CRD and in what rhymerl writes, either spelling in what it reads, and every
error naming a field the way the file (or the `--set` item) wrote it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from rhymerl.api import SpecError, dump_job, parse_job
from rhymerl.api.crd import crd
from rhymerl.api.spec import RLJob
from rhymerl.api.spelling import camel_keys

HEAD = "apiVersion: rhymerl.io/v1alpha1\nkind: RLJob\n"
SNAKE = HEAD + """spec:
  failure_policy: {backoff_limit: 5}
  rollout:
    min_replicas: 1
    max_replicas: 4
    spot:
      enabled: true
      node_selector: {cloud.google.com/gke-spot: "true"}
    tolerations:
    - {key: pool, operator: Equal, value: gpu, effect: NoExecute, toleration_seconds: 30}
    pod:
      service_account_name: reader
      volumes: [{name: code, configMap: {name: code}}]
      volume_mounts: [{name: code, mountPath: /opt/code}]
"""
CAMEL = HEAD + """spec:
  failurePolicy: {backoffLimit: 5}
  rollout:
    minReplicas: 1
    maxReplicas: 4
    spot:
      enabled: true
      nodeSelector: {cloud.google.com/gke-spot: "true"}
    tolerations:
    - {key: pool, operator: Equal, value: gpu, effect: NoExecute, tolerationSeconds: 30}
    pod:
      serviceAccountName: reader
      volumes: [{name: code, configMap: {name: code}}]
      volumeMounts: [{name: code, mountPath: /opt/code}]
"""


def _problems(text: str, overrides: list[str] | None = None) -> list[str]:
    with pytest.raises(SpecError) as exc:
        parse_job(text, "job.yaml", overrides)
    return [str(p) for p in exc.value.problems]


def test_a_snake_case_file_and_its_camel_case_twin_load_to_the_same_job() -> None:
    snake, camel = parse_job(SNAKE), parse_job(CAMEL)
    assert snake == camel
    assert (camel.spec.failure_policy.backoff_limit, camel.spec.rollout.tolerations[0].toleration_seconds) == (5, 30)
    assert camel_keys(RLJob, parse_job(SNAKE).model_dump(mode="json")) == camel.model_dump(mode="json", by_alias=True)


def test_the_resolved_job_is_written_camel_case_and_reads_back_the_same() -> None:
    job = parse_job(SNAKE)
    text = dump_job(job)
    assert "    maxReplicas: 4\n" in text and "      serviceAccountName: reader\n" in text
    assert re.findall(r"^\s*([a-z]+_[a-z_]+):", text, re.MULTILINE) == []  # no snake_case key left
    assert parse_job(text) == job


@pytest.mark.parametrize(("text", "expected"), [
    (CAMEL.replace("tolerationSeconds: 30", "tolerationSeconds: -1").replace("maxReplicas: 4", "maxReplicas: 0"),
     ["spec.rollout.tolerations.0.tolerationSeconds: Input should be greater than or equal to 0 (line 12)",
      "spec.rollout.maxReplicas: Input should be greater than 0 (line 7)"]),
    (SNAKE.replace("toleration_seconds: 30", "toleration_seconds: -1").replace("max_replicas: 4", "max_replicas: 0"),
     ["spec.rollout.tolerations.0.toleration_seconds: Input should be greater than or equal to 0 (line 12)",
      "spec.rollout.max_replicas: Input should be greater than 0 (line 7)"]),
], ids=["camel", "snake"])
def test_an_error_names_the_nested_field_and_the_list_item_as_the_file_spells_them(text: str,
                                                                                  expected: list[str]) -> None:
    assert _problems(text) == expected


def test_a_validator_names_its_fields_in_the_files_spelling_even_those_the_file_leaves_out() -> None:
    assert _problems(HEAD + "spec:\n  rollout: {minReplicas: 3, replicas: 3}\n") == [
        "spec.rollout.maxReplicas: must be >= minReplicas (line 4)"]
    assert _problems(HEAD + "spec:\n  rollout: {min_replicas: 3, replicas: 3}\n") == [
        "spec.rollout.max_replicas: must be >= min_replicas (line 4)"]
    assert _problems(HEAD + "spec:\n  controller:\n    pod: {service_account_name: x}\n") == [
        "spec.controller.pod.service_account_name: the controller runs as the job's own account (it patches the "
        "job's status); set it on the other roles (line 5)"]


def test_a_set_item_names_the_field_as_the_item_spells_it_and_replaces_the_files_other_spelling() -> None:
    assert _problems(SNAKE, ["rollout.maxReplicas=0"]) == [
        "spec.rollout.maxReplicas: Input should be greater than 0 (--set rollout.maxReplicas=0)"]
    assert _problems(CAMEL, ["failure_policy.backoff_limit=-1"]) == [
        "spec.failurePolicy.backoff_limit: Input should be greater than or equal to 0 "
        "(--set failure_policy.backoff_limit=-1)"]
    assert parse_job(CAMEL, overrides=["rollout.max_replicas=2"]).spec.rollout.max_replicas == 2


def test_one_field_given_in_both_spellings_in_one_mapping_is_an_error_naming_both() -> None:
    assert _problems(HEAD + "spec:\n  rollout:\n    maxReplicas: 2\n    max_replicas: 3\n") == [
        "spec.rollout.max_replicas: given twice, as max_replicas and as maxReplicas: keep one (line 6)"]


@pytest.mark.parametrize(("key", "suggested"), [("maxReplica", "maxReplicas"), ("max_replica", "max_replicas"),
                                                ("minreplicas", "minReplicas")])
def test_an_unknown_key_is_offered_the_closest_field_in_its_own_spelling(key: str, suggested: str) -> None:
    assert _problems(HEAD + f"spec:\n  rollout:\n    {key}: 2\n") == [
        f"spec.rollout.{key}: unknown field; did you mean '{suggested}'? (line 5)"]


def _spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _nodes(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, node)]
    for key, sub in node.get("properties", {}).items():
        found += _nodes(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        found += _nodes(node["items"], f"{path}[]")
    return found


def test_the_crd_names_no_property_of_the_spec_or_the_status_in_snake_case() -> None:
    schema = _spec_schema()
    paths = [p for top in ("spec", "status") for p, _ in _nodes(schema["properties"][top], top)]
    assert [p for p in paths if "_" in p.rsplit(".", 1)[-1]] == []
    assert {"spec.rollout.maxReplicas", "spec.rollout.pod.volumeMounts", "status.progress.rewardMean"} <= set(paths)


def test_every_cel_rule_reads_only_properties_the_schema_has() -> None:
    checked = 0
    for path, node in _nodes(_spec_schema()):
        for rule in node.get("x-kubernetes-validations", []):
            for match in re.finditer(r"\b(?:self|oldSelf)((?:\.\w+)+)(\()?", rule["rule"]):
                parts = match.group(1).split(".")[1:]
                if match.group(2):  # a method: self.redisUrl.matches(...)
                    parts = parts[:-1]
                here = node
                for i, part in enumerate(parts):
                    if here.get("properties") is None and parts[:i] == ["metadata"]:
                        break  # the object's metadata: the API server's own schema
                    assert part in here.get("properties", {}), f"{path}: {rule['rule']} reads {part}"
                    here = here["properties"][part]
                checked += 1
    assert checked > 20


def test_the_transition_crd_keeps_any_spec_as_written_and_the_status_as_the_crd_has_it() -> None:
    bridge = crd(transition=True)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert bridge["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"] is True
    assert "properties" not in bridge["properties"]["spec"] and "default" not in bridge["properties"]["spec"]
    assert bridge["properties"]["status"] == _spec_schema()["properties"]["status"]


def test_respelling_a_stored_job_renames_fields_only_and_refuses_one_given_twice() -> None:
    stored = {"apiVersion": "rhymerl.io/v1alpha1", "kind": "RLJob",
              "metadata": {"name": "a", "resourceVersion": "7", "labels": {"team_name": "rl"}},
              "spec": {"rollout": {"max_replicas": 4, "node_selector": {"pool_name": "spot"}}},
              "status": {"phase": "Running", "progress": {"rewardMean": 0.5}}}
    assert camel_keys(RLJob, stored) == {
        "apiVersion": "rhymerl.io/v1alpha1", "kind": "RLJob",
        "metadata": {"name": "a", "resourceVersion": "7", "labels": {"team_name": "rl"}},
        "spec": {"rollout": {"maxReplicas": 4, "nodeSelector": {"pool_name": "spot"}}},
        "status": {"phase": "Running", "progress": {"rewardMean": 0.5}}}
    with pytest.raises(ValueError, match="given twice, as max_replicas and as maxReplicas"):
        camel_keys(RLJob, {"spec": {"rollout": {"max_replicas": 4, "maxReplicas": 2}}})
