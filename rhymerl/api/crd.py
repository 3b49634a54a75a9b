"""Generate the RLJob CustomResourceDefinition from the pydantic spec, so the two can never drift.

Kubernetes wants a *structural* schema: every node typed, no ``$ref``, ``nullable`` instead of
``anyOf [..., null]``, ``x-kubernetes-int-or-string`` for quantities.
"""

from __future__ import annotations

from typing import Any

import yaml

from rhymerl.api.spec import GROUP, KIND, VERSION, RLJobSpec, RLJobStatus

PLURAL = "rljobs"
SINGULAR = "rljob"
SHORT_NAMES = ["rlj"]

_KEEP = ("type", "description", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
         "pattern", "maxLength", "minLength", "format")


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
            out[key] = node[key]
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


def _schema_of(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(mode="serialization")
    return structural(raw, raw.get("$defs", {}))


def crd() -> dict[str, Any]:
    spec_schema = _schema_of(RLJobSpec)
    status_schema = _schema_of(RLJobStatus)
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
        {"name": "Epoch", "type": "integer", "jsonPath": ".status.epoch"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.rollout.readyReplicas",
         "description": "rollout replicas ready"},
        {"name": "Desired", "type": "integer", "jsonPath": ".spec.rollout.replicas",
         "description": "rollout replicas desired"},
        {"name": "Acceptance", "type": "number", "jsonPath": ".status.acceptanceRate",
         "description": "speculative draft acceptance rate"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
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
                        "statusReplicasPath": ".status.rollout.replicas",
                        "labelSelectorPath": ".status.rollout.selector",
                    },
                },
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "An RL post-training job (GRPO/DAPO) with history-accelerated rollout.",
                    "required": ["spec"],
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


def crd_yaml() -> str:
    header = "# Generated by `rhymerl crd` from rhymerl.api.spec; do not edit by hand.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120)
