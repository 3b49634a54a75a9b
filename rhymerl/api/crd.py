"""Generate the RLJob CustomResourceDefinition from the pydantic spec, so the two can never drift.

Kubernetes wants a *structural* schema: every node typed, no ``$ref``, ``nullable`` instead of
``anyOf [..., null]``, ``x-kubernetes-int-or-string`` for quantities. Every spec block defaults to
``{}`` so the API server stores the job fully resolved, and the CEL rules below (checked at
admission, before the operator sees an object) can rely on every defaulted field being there.
Each rule restates a pydantic validator of rhymerl.api.spec, or makes a field immutable. Property names
are the fields' camelCase aliases (Kubernetes' API conventions, as `kubectl explain` shows them).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from rhymerl.api.algorithm import AlgorithmSpec
from rhymerl.api.inputs import DataSpec, ModelSpec
from rhymerl.api.placement import SpotSpec, Toleration
from rhymerl.api.rollout import RolloutSpec
from rhymerl.api.services import HistorySpec
from rhymerl.api.spec import GROUP, KIND, MAX_JOB_NAME, VERSION, RLJobSpec, StorageSpec
from rhymerl.api.speculation import EMBEDDED_DRAFTS, DraftPrefixSpec, DraftWindowSpec
from rhymerl.api.spelling import camel_text
from rhymerl.api.status import RLJobStatus

PLURAL = "rljobs"
SINGULAR = "rljob"
SHORT_NAMES = ["rlj"]

_KEEP = ("type", "description", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
         "pattern", "maxLength", "minLength", "format", "required", "maxItems", "minItems", "maxProperties",
         "x-kubernetes-validations", "x-kubernetes-preserve-unknown-fields")


@dataclass(frozen=True)
class Rule:
    """One `x-kubernetes-validations` entry: `rule` must hold for `self` (and `oldSelf` on update)."""

    rule: str
    message: str
    field_path: str | None = None

    @property
    def transition(self) -> bool:
        return "oldSelf" in self.rule

    def as_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            out["fieldPath"] = self.field_path
        return out


def _immutable(what: str, why: str) -> Rule:
    return Rule("self == oldSelf", f"{what} is immutable: {why}")


_RECREATE = "delete the RLJob and create a new one"
EMBEDDED_POLICIES = "[" + ", ".join(f"'{p}'" for p in EMBEDDED_DRAFTS) + "]"  # a CEL list
# Rules per spec block, attached wherever the block appears; the object's defaults fill every field they
# read except those tested with has(). They name fields as the API server stores them: by their camelCase
# aliases (tests/api/test_crd_cel.py checks each name against the schema).
RULES: dict[type[BaseModel], tuple[Rule, ...]] = {
    ModelSpec: (_immutable("spec.model", f"{_RECREATE} to train another model"),),
    DataSpec: (
        _immutable("spec.data", f"{_RECREATE} to train on other data"),
        Rule("self.minOps <= self.medianOps && self.medianOps <= self.maxOps",
             "medianOps: must lie between minOps and maxOps", ".medianOps"),
    ),
    AlgorithmSpec: (
        _immutable("spec.algorithm", f"{_RECREATE} to change the algorithm"),
        Rule("self.groupSize >= 2", "groupSize: group-relative advantages need at least 2 responses per prompt",
             ".groupSize"),
        Rule("!has(self.miniBatchSize) || self.miniBatchSize <= self.groupSize * self.promptsPerStep",
             "miniBatchSize: larger than the batch (groupSize * promptsPerStep)", ".miniBatchSize"),
    ),
    RolloutSpec: (
        Rule("self.minReplicas <= self.maxReplicas", "maxReplicas: must be >= minReplicas", ".maxReplicas"),
        Rule("self.minReplicas <= self.replicas && self.replicas <= self.maxReplicas",
             "replicas: must lie between minReplicas and maxReplicas", ".replicas"),
        Rule("self.resources.gpu >= self.gpusPerReplica",
             "resources.gpu: must be at least gpusPerReplica (a replica's GPUs are its pod's)", ".resources.gpu"),
        Rule("self.engine != 'vllm' || !self.speculation.freedDrafters || "
             "self.speculation.method in ['history', 'fastest-of-n']",
             "speculation: freedDrafters on vLLM needs method history or fastest-of-n (rhymerl's proposer verifies "
             "the freed drafters' drafts inside vLLM)", ".speculation"),
        Rule("self.gpusPerReplica <= 1 || self.engine != 'vllm' || !self.speculation.freedDrafters",
             "speculation: freedDrafters on vLLM needs gpusPerReplica 1 (a drafter's link reaches rhymerl's proposer "
             "only where vLLM's one worker runs in the rollout worker's process)", ".speculation"),
        Rule("!self.autoscaling.enabled || self.minReplicas < self.maxReplicas",
             "autoscaling: minReplicas equals maxReplicas: nothing to scale; raise maxReplicas, or leave "
             "autoscaling off", ".autoscaling"),
    ),
    SpotSpec: (
        Rule("!self.enabled || (has(self.nodeSelector) && size(self.nodeSelector) > 0) || "
             "(has(self.tolerations) && size(self.tolerations) > 0)",
             "nodeSelector: name the spot nodes' labels (or their taints in tolerations)", ".nodeSelector"),
    ),
    Toleration: (
        Rule("self.operator != 'Exists' || !has(self.value)", "value: must be omitted when operator is Exists"),
        Rule("has(self.key) || self.operator == 'Exists'", "operator: must be Exists when key is omitted"),
        Rule("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
             "tolerationSeconds: only with effect NoExecute"),
    ),
    RLJobSpec: (
        Rule(f"self.rollout.speculation.method != 'draft-model' || has(self.rollout.speculation.draftModel) || "
             f"self.model.path in {EMBEDDED_POLICIES}",
             "rollout.speculation.draftModel: required when method is draft-model (model.path has no embedded draft "
             "model)", ".rollout.speculation.draftModel"),
        Rule(f"!self.rollout.speculation.freedDrafters || has(self.rollout.speculation.draftModel) || "
             f"self.model.path in {EMBEDDED_POLICIES}",
             "rollout.speculation.draftModel: required when freedDrafters is true (what the freed workers draft "
             "with; model.path has no embedded draft model)", ".rollout.speculation.draftModel"),
    ),
    DraftWindowSpec: (Rule("self.initial <= self.max", "initial: larger than max", ".initial"),),
    DraftPrefixSpec: (Rule("self.min <= self.max", "min: larger than max", ".min"),),
    HistorySpec: (
        Rule("self.store != 'redis' || has(self.redisUrl)", "redisUrl: required when store is redis",
             ".redisUrl"),
        # a password in the URL would be stored in the object itself: refused at admission, before etcd
        Rule("!has(self.redisUrl) || !self.redisUrl.matches('^[^/?#]*//[^/?#]*:[^/?#]*@')",
             "redisUrl: no password in the URL; name its Secret in redisPasswordSecret", ".redisUrl"),
    ),
    StorageSpec: (_immutable("spec.checkpoint.storage", "a StatefulSet's volume claims cannot change"),),
}
# On the object itself, where only metadata.name (unbounded to the cost estimator: no regex) is visible; the
# API server already insists on a DNS-1123 subdomain, and the operator on a DNS-1035 label (InvalidSpec).
ROOT_RULES = (
    Rule(f"self.metadata.name.size() <= {MAX_JOB_NAME}", f"metadata.name: at most {MAX_JOB_NAME} characters (it "
         "names the job's StatefulSets, whose names stay within 52)"),
    Rule("!self.metadata.name.contains('.')", "metadata.name: no dots (it names the job's Services)"),
)


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is not None:
        target = defs[ref.rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return node


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    node = _resolve(node, defs)
    out: dict[str, Any] = {}
    variants = node.get("anyOf")
    if variants is not None:
        types = [_resolve(v, defs) for v in variants]
        non_null = [v for v in types if v.get("type") != "null"]
        nullable = len(non_null) < len(types)
        kinds = {v.get("type") for v in non_null}
        if kinds == {"string", "integer"}:
            out["x-kubernetes-int-or-string"] = True
        elif len(non_null) == 1:
            out.update(structural(non_null[0], defs))
        else:
            raise ValueError(f"cannot express union {kinds} structurally")
        if nullable:
            out["nullable"] = True
    if "const" in node:
        out["type"] = "string"
        out["enum"] = [node["const"]]
    for key in _KEEP:
        if key in node and key not in out:
            out[key] = copy.deepcopy(node[key])  # shared nodes would come out as YAML anchors
    if "description" in out:  # `kubectl explain` shows the names the object has
        out["description"] = camel_text(out["description"])
    if "exclusiveMinimum" in out and not isinstance(out["exclusiveMinimum"], bool):
        out["minimum"] = out.pop("exclusiveMinimum")
        out["exclusiveMinimum"] = True
    if "exclusiveMaximum" in out and not isinstance(out["exclusiveMaximum"], bool):
        out["maximum"] = out.pop("exclusiveMaximum")
        out["exclusiveMaximum"] = True
    if "default" in node and node["default"] is not None:
        out["default"] = node["default"]
    if out.get("type") == "object" or "properties" in node:
        out["type"] = "object"
        props = node.get("properties")
        if props:
            out["properties"] = {k: structural(v, defs) for k, v in props.items()}
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = structural(extra, defs)
    if out.get("type") == "array":
        out["items"] = structural(node.get("items", {}), defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    out.pop("title", None)
    return out


def _schema_of(model: type[BaseModel], rules: dict[type[BaseModel], tuple[Rule, ...]] | None = None
               ) -> dict[str, Any]:
    raw = model.model_json_schema(mode="serialization")
    defs = raw.get("$defs", {})
    for owner, owned in (rules or {}).items():
        node = raw if owner is model else defs.get(owner.__name__)
        if node is not None:
            node["x-kubernetes-validations"] = [r.as_schema() for r in owned]
    return structural(raw, defs)


def _default_blocks(node: dict[str, Any]) -> None:
    """Default every non-nullable object property to {} so its own defaults apply when it is omitted."""
    for sub in node.get("properties", {}).values():
        if sub.get("type") == "object" and "properties" in sub:
            if "default" not in sub and not sub.get("nullable"):
                sub["default"] = {}
            _default_blocks(sub)


def _status_schema() -> dict[str, Any]:
    schema = _schema_of(RLJobStatus)
    conditions = schema.get("properties", {}).get("conditions")
    if conditions is not None:  # metav1.Condition-shaped: one entry per type, merged by type
        conditions["x-kubernetes-list-type"] = "map"
        conditions["x-kubernetes-list-map-keys"] = ["type"]
        item = conditions["items"]
        item["required"] = sorted(set(item.get("required", [])) | {"type", "status"})
    return schema


# The spec of the CRD that bridges the upgrade from the snake_case CRD (docs/operations.md, "Upgrading"):
# kept as stored, neither pruned nor defaulted, so RLJobs written in either spelling survive until rewritten.
TRANSITION_SPEC = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                   "description": "any RLJob spec, in either spelling, kept as written (the upgrade's transition "
                   "CRD: the operator validates it)"}


def crd(transition: bool = False) -> dict[str, Any]:
    """The RLJob CRD; `transition`: with TRANSITION_SPEC in place of the spec's schema and rules."""
    spec_schema = copy.deepcopy(TRANSITION_SPEC) if transition else _schema_of(RLJobSpec, RULES)
    _default_blocks(spec_schema)
    status_schema = _status_schema()
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
        {"name": "Reward", "type": "number", "jsonPath": ".status.progress.rewardMean",
         "description": "mean reward of the last step"},
        {"name": "Acceptance", "type": "number", "jsonPath": ".status.progress.acceptanceRate",
         "description": "speculative draft acceptance rate of the last step"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Epoch", "type": "integer", "jsonPath": ".status.progress.epoch", "priority": 1},
        {"name": "Rollout", "type": "integer", "jsonPath": ".status.replicas", "priority": 1,
         "description": "rollout replicas ready"},
        {"name": "Desired", "type": "integer", "jsonPath": ".spec.rollout.replicas", "priority": 1,
         "description": "rollout replicas desired"},
        {"name": "Suspended", "type": "boolean", "jsonPath": ".spec.suspend", "priority": 1},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": SHORT_NAMES, "categories": ["all"]},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "additionalPrinterColumns": columns,
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.rollout.replicas",
                        "statusReplicasPath": ".status.replicas",
                        "labelSelectorPath": ".status.selector",
                    },
                },
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "An RL post-training job (GRPO/DAPO) with history-accelerated rollout.",
                    "required": ["spec"],
                    "x-kubernetes-validations": [r.as_schema() for r in ROOT_RULES],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec_schema,
                        "status": status_schema,
                    },
                }},
            }],
        },
    }


def crd_yaml(transition: bool = False) -> str:
    header = "# Generated by `rhymerl crd` from rhymerl.api.spec; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(transition), sort_keys=False, width=120)


def crd_helm_template() -> str:
    """The same CRD as the Helm chart's template (charts/rhymerl/templates/crd.yaml): behind
    `crds.enabled`, with the release's labels and, with `crds.keep`, Helm's keep policy."""
    body = crd()
    if "{{" in yaml.safe_dump(body):
        raise ValueError("the CRD holds '{{', which Helm would read as a template action")
    head = {"apiVersion": body["apiVersion"], "kind": body["kind"]}
    return (
        "# Generated by `rhymerl crd --helm` from rhymerl.api.spec; do not edit by hand.\n"
        "{{- if .Values.crds.enabled }}\n"
        + yaml.safe_dump(head, sort_keys=False)
        + "metadata:\n"
        f"  name: {body['metadata']['name']}\n"
        "  labels:\n"
        "    {{- include \"rhymerl.labels\" . | nindent 4 }}\n"
        "  {{- if .Values.crds.keep }}\n"
        "  annotations:\n"
        "    helm.sh/resource-policy: keep\n"
        "  {{- end }}\n"
        + yaml.safe_dump({"spec": body["spec"]}, sort_keys=False, width=120)
        + "{{- end }}\n"
    )
