"""The CRD's CEL rules (x-kubernetes-validations), evaluated with cel-python against objects shaped as
the API server stores them (defaults filled in): each holds for a valid job, fails for a job that breaks
it, and agrees with the spec's own validators, so admission and `rhymerl validate` refuse the same jobs."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest
from pydantic import ValidationError

from rhymerl.api import RLJob
from rhymerl.api.crd import crd

SCHEMA = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
ENV = celpy.Environment()
TOLERATION = {"key": "pool", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}


def _node(path: str) -> dict[str, Any]:
    node = SCHEMA
    for part in filter(None, path.split(".")):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


def _rules(path: str, on_create: bool = False) -> list[str]:
    """The rules at `path`; on_create: without transition rules (those read oldSelf, so only run on update)."""
    rules = [r["rule"] for r in _node(path).get("x-kubernetes-validations", [])]
    return [r for r in rules if not on_create or "oldSelf" not in r]


def _holds(rule: str, value: Any, old: Any = None) -> bool:
    activation = {"self": celpy.json_to_cel(value)}
    if old is not None:
        activation["oldSelf"] = celpy.json_to_cel(old)
    return bool(ENV.program(ENV.compile(rule)).evaluate(activation))


def _stored(**spec: Any) -> dict[str, Any]:
    """A job as the API server keeps it: apiVersion, kind, metadata and the spec with defaults filled."""
    dumped: dict[str, Any] = RLJob.model_validate({"metadata": {"name": "job"}, "spec": spec}).model_dump(
        mode="json", by_alias=True, exclude_none=True)
    return dumped


def _at(doc: dict[str, Any], path: str) -> Any:
    for part in filter(None, path.split(".")):
        doc = doc[part]
    return doc


def _set(doc: dict[str, Any], path: str, change: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target = _at(out, path) if path else out
    for key, value in change.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return out


# (block path, the rule's text, the job before (spec overrides), the change that breaks the rule)
STATIC = [
    ("spec.rollout", "self.minReplicas <= self.maxReplicas", {}, {"minReplicas": 3, "maxReplicas": 2,
                                                                   "replicas": 2}),
    ("spec.rollout", "self.minReplicas <= self.replicas && self.replicas <= self.maxReplicas",
     {"rollout": {"maxReplicas": 4}}, {"replicas": 5}),
    ("spec.rollout", "self.resources.gpu >= self.gpusPerReplica",
     {"rollout": {"gpusPerReplica": 2, "resources": {"gpu": 2}}}, {"gpusPerReplica": 4}),
    ("spec.rollout", "!self.autoscaling.enabled", {"rollout": {"maxReplicas": 4, "autoscaling": {"enabled": True}}},
     {"maxReplicas": 1, "replicas": 1}),
    ("spec.rollout", "self.engine != 'vllm' || !self.speculation.freedDrafters",
     {"rollout": {"engine": "vllm", "speculation": {"freedDrafters": True, "draftModel": "builtin:tiny-arith-draft"}}},
     {"speculation": {"freedDrafters": True, "draftModel": "builtin:tiny-arith-draft", "method": "ngram"}}),
    ("spec.rollout", "self.gpusPerReplica <= 1 || self.engine != 'vllm'",
     {"rollout": {"engine": "vllm", "resources": {"gpu": 2},
                  "speculation": {"freedDrafters": True, "draftModel": "builtin:tiny-arith-draft"}}},
     {"gpusPerReplica": 2}),
    ("spec.rollout.spot", "!self.enabled", {}, {"enabled": True}),
    ("spec.data", "self.minOps <= self.medianOps", {}, {"medianOps": 60}),
    ("spec.algorithm", "self.groupSize >= 2", {}, {"groupSize": 1}),
    ("spec.algorithm", "!has(self.miniBatchSize)", {"algorithm": {"miniBatchSize": 64}},
     {"miniBatchSize": 65}),
    ("spec", "self.rollout.speculation.method != 'draft-model'",
     {"model": {"path": "/models/m"}, "rollout": {"speculation": {"method": "draft-model", "draftModel": "/models/d"}}},
     {"rollout": {"speculation": {"method": "draft-model"}}}),
    ("spec", "!self.rollout.speculation.freedDrafters",
     {"model": {"path": "/models/m"}, "rollout": {"speculation": {"freedDrafters": True, "draftModel": "/models/d"}}},
     {"rollout": {"speculation": {"freedDrafters": True}}}),
    ("spec.rollout.speculation.window", "self.initial <= self.max", {}, {"initial": 40}),
    ("spec.rollout.speculation.prefix", "self.min <= self.max", {}, {"min": 40}),
    ("spec.history", "self.store != 'redis'", {}, {"store": "redis"}),
    ("spec.history", "!has(self.redisUrl)", {"history": {"store": "redis", "redisUrl": "redis://user@r:6379/0"}},
     {"redisUrl": "redis://user:s3cret@r:6379/0"}),
]
TOLERATIONS = [
    ("self.operator != 'Exists'", {"operator": "Exists"}),
    ("has(self.key)", {"key": None, "value": None}),
    ("!has(self.tolerationSeconds)", {"tolerationSeconds": 30}),
]
IMMUTABLE = ["spec.model", "spec.data", "spec.algorithm", "spec.checkpoint.storage"]
IMMUTABLE_CHANGES = {"spec.model": {"path": "/models/other"}, "spec.data": {"seed": 7},
                     "spec.algorithm": {"lr": 0.5}, "spec.checkpoint.storage": {"size": "1Ti"}}


def _rule(path: str, prefix: str) -> str:
    found = [r for r in _rules(path) if r.startswith(prefix)]
    assert len(found) == 1, f"{path}: no single rule starting with {prefix!r} in {_rules(path)}"
    return found[0]


@pytest.mark.parametrize(("path", "prefix", "before", "change"), STATIC, ids=[f"{c[0]}:{c[1]}" for c in STATIC])
def test_a_rule_holds_for_a_valid_job_and_fails_for_one_the_spec_also_refuses(
        path: str, prefix: str, before: dict[str, Any], change: dict[str, Any]) -> None:
    rule = _rule(path, prefix)
    valid = _stored(**before)
    assert all(_holds(r, _at(valid, path)) for r in _rules(path, on_create=True))
    invalid = _set(valid, path, change)
    assert not _holds(rule, _at(invalid, path))
    with pytest.raises(ValidationError):
        RLJob.model_validate(invalid)


@pytest.mark.parametrize("speculation", [{"method": "draft-model"}, {"freedDrafters": True}])
def test_the_embedded_policy_needs_no_draft_model_named_it_gets_its_own(speculation: dict[str, Any]) -> None:
    stored = _set(_stored(), "spec", {"rollout": {"speculation": speculation}})  # as written: no draftModel
    assert all(_holds(r, stored["spec"]) for r in _rules("spec", on_create=True))
    assert RLJob.model_validate(stored).spec.rollout.speculation.draft_model == "builtin:tiny-arith-draft"
    named = _set(stored, "spec", {"rollout": {"speculation": {**speculation, "draftModel": "/models/d"}}})
    assert RLJob.model_validate(named).spec.rollout.speculation.draft_model == "/models/d"


@pytest.mark.parametrize(("prefix", "change"), TOLERATIONS, ids=[t[0] for t in TOLERATIONS])
def test_toleration_rules_hold_for_a_valid_toleration_wherever_one_is_allowed(prefix: str,
                                                                              change: dict[str, Any]) -> None:
    for path in ("spec.rollout.tolerations.[]", "spec.rollout.spot.tolerations.[]", "spec.train.tolerations.[]",
                 "spec.controller.tolerations.[]", "spec.reward.tolerations.[]", "spec.history.tolerations.[]"):
        rule = _rule(path, prefix)
        assert all(_holds(r, TOLERATION) for r in _rules(path))
        broken = _set(TOLERATION, "", change)
        assert not _holds(rule, broken)
        with pytest.raises(ValidationError):
            RLJob.model_validate({"spec": {"train": {"tolerations": [broken]}}})


@pytest.mark.parametrize("path", IMMUTABLE)
def test_model_data_algorithm_and_checkpoint_storage_cannot_change_after_creation(path: str) -> None:
    rule = _rule(path, "self == oldSelf")
    old = _at(_stored(), path)
    assert _holds(rule, copy.deepcopy(old), old)
    assert not _holds(rule, _set(old, "", IMMUTABLE_CHANGES[path]), old)


def test_a_vllm_job_whose_fastest_of_n_names_a_draft_model_is_admitted() -> None:
    stored = _stored(rollout={"engine": "vllm", "speculation": {"method": "fastest-of-n",
                                                                "draftModel": "builtin:tiny-arith-draft"}})
    for path in ("spec", "spec.rollout", "spec.rollout.speculation"):
        assert all(_holds(r, _at(stored, path)) for r in _rules(path, on_create=True)), path


def test_scaling_rollout_within_bounds_is_allowed_on_update() -> None:
    old = _stored(rollout={"replicas": 2, "maxReplicas": 8})
    new = _set(old, "spec.rollout", {"replicas": 6})
    assert all(_holds(r, _at(new, "spec.rollout"), _at(old, "spec.rollout")) for r in _rules("spec.rollout"))
    assert all(_holds(r, _at(new, p), _at(old, p)) for p in IMMUTABLE for r in _rules(p))


@pytest.mark.parametrize(("name", "valid"), [("a" * 41, True), ("a" * 42, False), ("math.grpo", False)])
def test_root_rules_limit_the_job_name_to_what_can_name_its_children(name: str, valid: bool) -> None:
    obj = {"apiVersion": "rhymerl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": name}, "spec": {}}
    rules = [r["rule"] for r in SCHEMA["x-kubernetes-validations"]]
    assert all(_holds(r, obj) for r in rules) is valid
    if not valid:
        with pytest.raises(ValidationError):
            RLJob.model_validate({"metadata": {"name": name}})


def _all_rules(node: dict[str, Any], path: str = "") -> set[tuple[str, str]]:
    found = {(path, r["rule"]) for r in node.get("x-kubernetes-validations", [])}
    for key, sub in node.get("properties", {}).items():
        found |= _all_rules(sub, f"{path}.{key}".lstrip("."))
    if isinstance(node.get("items"), dict):
        found |= _all_rules(node["items"], f"{path}.[]")
    return found


def test_every_rule_in_the_crd_is_exercised_by_a_case_above() -> None:
    tested = {(p, _rule(p, prefix)) for p, prefix, _, _ in STATIC}
    tested |= {(p, "self == oldSelf") for p in IMMUTABLE}
    tested |= {("", r["rule"]) for r in SCHEMA["x-kubernetes-validations"]}
    toleration_rules = {r for p, r in _all_rules(SCHEMA) if p.endswith("tolerations.[]")}
    assert toleration_rules == {_rule("spec.train.tolerations.[]", prefix) for prefix, _ in TOLERATIONS}
    untested = {(p, r) for p, r in _all_rules(SCHEMA) if (p, r) not in tested and not p.endswith("tolerations.[]")}
    assert untested == set()


def test_every_rule_compiles_as_cel() -> None:
    for _, rule in _all_rules(SCHEMA):
        ENV.compile(rule)


def test_every_spec_block_defaults_to_an_empty_object_so_its_own_defaults_apply() -> None:
    spec = SCHEMA["properties"]["spec"]["properties"]
    for name in ("model", "data", "algorithm", "reward", "rollout", "train", "history", "controller", "checkpoint",
                 "failurePolicy", "images"):
        assert spec[name]["default"] == {}, name
    assert spec["rollout"]["properties"]["spot"]["default"] == {}
    assert "default" not in spec["history"]["properties"]["redisPasswordSecret"]


def test_conditions_are_a_list_map_keyed_by_type() -> None:
    conditions = SCHEMA["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


def test_the_crd_fits_the_last_applied_annotation_of_a_client_side_kubectl_apply() -> None:
    import json

    assert len(json.dumps(crd())) < 262_144 // 2  # with room to grow; past the limit `kubectl apply` fails
