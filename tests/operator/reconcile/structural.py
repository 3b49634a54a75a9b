"""What the API server does to a custom resource with a structural schema, on every request that writes it
and every read from storage: prune what the schema does not name, then fill in its defaults.

Kubernetes' own code (k8s.io/apiextensions-apiserver): pkg/apiserver/schema/pruning/algorithm.go
(`Prune`: a field the schema does not name is dropped unless a node above says
x-kubernetes-preserve-unknown-fields; at the resource's root apiVersion, kind and metadata stay) and
pkg/apiserver/schema/defaulting/algorithm.go (`Default`: a missing property, or a null one the schema does
not call nullable, gets a deep copy of its default; then every value is defaulted in turn, so a block
defaulted to {} gets its own fields' defaults). Both run on create and update requests and when an object
is read from etcd; defaults applied on read are not written back until the object's next write
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#defaulting
and #field-pruning). Pure functions over JSON values: the emulator (kube_emulator.py) calls them.
"""

from __future__ import annotations

import copy
from typing import Any

_ROOT_KEPT = ("apiVersion", "kind", "metadata")


def prune(value: Any, schema: dict[str, Any] | None, root: bool = False) -> None:
    """Drop (in place) what `schema` does not name, as pruning.Prune does."""
    if schema is not None and schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        if schema is None:
            value.clear()
            return
        props: dict[str, Any] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key in list(value):
            if root and key in _ROOT_KEPT:
                continue
            if key in props:
                prune(value[key], props[key])
            elif isinstance(extra, dict):
                prune(value[key], extra)
            else:
                del value[key]
    elif isinstance(value, list):
        for item in value:
            prune(item, None if schema is None else schema.get("items"))


def default(value: Any, schema: dict[str, Any] | None) -> None:
    """Fill in (in place) the defaults of `schema`, as defaulting.Default does."""
    if schema is None:
        return
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties") or {}
        for key, prop in props.items():
            if "default" not in prop:
                continue
            if key not in value or (value[key] is None and not prop.get("nullable")):
                value[key] = copy.deepcopy(prop["default"])
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                default(item, props[key])
            elif isinstance(extra, dict):
                default(item, extra)
    elif isinstance(value, list):
        for item in value:
            default(item, schema.get("items"))


def stored(obj: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the API server keeps and serves it under `schema` (a CRD version's openAPIV3Schema): a copy,
    pruned, then defaulted."""
    out = copy.deepcopy(obj)
    prune(out, schema, root=True)
    default(out, schema)
    return out


def merge_patch(before: Any, after: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns `before` into `after`: what the emulator hands kmock,
    which stores an update by merging it into the object."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return copy.deepcopy(after)
    out: dict[str, Any] = {k: None for k in before if k not in after}
    for key, value in after.items():
        if key not in before:
            out[key] = copy.deepcopy(value)
        elif before[key] != value:
            out[key] = merge_patch(before[key], value)
    return out
