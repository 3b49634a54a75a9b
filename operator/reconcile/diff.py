"""Desired vs actual children of one RLJob -> the writes that converge them. Pure: no client, no I/O.

A child is in sync when every field the builders set has the value they set (fields the API server
defaults, and fields other controllers add, are not ours to compare) and its desired-hash annotation
names the same desired object. The hash catches what a field-by-field comparison cannot: a field we
stopped setting (a removed node selector), which server-side apply then drops. Comparing only what we
own is what makes a pass with nothing changed write nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from rhymerl.operator.manifests.labels import COMPONENT_KEY
from rhymerl.operator.manifests.spec_config import SPEC_HASH_ANNOTATION

Manifest = dict[str, Any]

DESIRED_HASH = "rhymerl.io/desired-hash"
APPLIED = "rhymerl.io/applied"  # what the pods run from, as written, with the spec hash it was built for: pinned
# Fields the API server refuses to change: a difference there means delete, then create anew.
IMMUTABLE: dict[str, tuple[tuple[str, ...], ...]] = {
    "StatefulSet": (("spec", "selector"), ("spec", "serviceName"), ("spec", "volumeClaimTemplates"),
                    ("spec", "podManagementPolicy")),
    "RoleBinding": (("roleRef",),),
    "Service": (("spec", "clusterIP"),),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {None: Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal(10**3),
           "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15),
           "E": Decimal(10**18), "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
           "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60)}


@dataclass(frozen=True, order=True)
class ObjectRef:
    """One child to delete, and why."""

    kind: str
    name: str
    api_version: str
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    """The writes of one pass: apply (create or patch) and delete. `requeue`: an object is being
    replaced (deleted now, created by the next pass once it is gone)."""

    apply: tuple[Manifest, ...] = ()
    delete: tuple[ObjectRef, ...] = ()
    requeue: bool = False
    unchanged: tuple[str, ...] = field(default=(), compare=False)

    @property
    def writes(self) -> int:
        return len(self.apply) + len(self.delete)


def key(obj: Manifest) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def desired_hash(obj: Manifest) -> str:
    """16 hex digits of the object as built (before the hash annotation is added)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stamped(obj: Manifest) -> Manifest:
    """`obj` with its desired-hash annotation, as it is applied."""
    meta = dict(obj["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), DESIRED_HASH: desired_hash(obj)}
    return {**obj, "metadata": meta}


def quantity(value: object) -> Decimal | None:
    """A Kubernetes quantity ('500m', '2Gi', 4) as a number; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        return None
    try:
        return Decimal(match.group(1)) * _SUFFIX[match.group(2)]
    except InvalidOperation:
        return None


def _is_zero(value: object) -> bool:
    """The API server omits empty and zero-valued fields (`omitempty`): absent means the same."""
    return value is None or value is False or value == 0 or value == "" or value == {} or value == []


def _same_scalar(want: object, have: object) -> bool:
    if want == have and type(want) is type(have):
        return True
    if isinstance(want, bool) or isinstance(have, bool):
        return False
    if isinstance(want, int | float) and isinstance(have, int | float):
        return want == have
    a, b = quantity(want), quantity(have)
    return a is not None and a == b


def covers(want: object, have: object) -> bool:
    """True when `have` (the object as the server returns it) holds every field of `want` (as built)
    with the same value. Extra fields in `have` are ignored; lists must match item by item."""
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return False
        return all(covers(v, have[k]) if k in have else _is_zero(v) for k, v in want.items())
    if isinstance(want, list):
        if not isinstance(have, list) or len(want) != len(have):
            return False
        return all(covers(w, h) for w, h in zip(want, have, strict=True))
    return _same_scalar(want, have)


def _at(obj: Manifest, path: tuple[str, ...]) -> object:
    node: object = obj
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def immutable_change(want: Manifest, have: Manifest) -> tuple[str, ...] | None:
    """The first field of `want` the server cannot change in place that differs in `have`."""
    for path in IMMUTABLE.get(want["kind"], ()):
        wanted = _at(want, path)
        if wanted is not None and not covers(wanted, _at(have, path)):
            return path
    return None


def in_sync(want: Manifest, have: Manifest) -> bool:
    """`want` is stamped (see `stamped`); `have` is the object read back from the server."""
    ours = want["metadata"]["annotations"][DESIRED_HASH]
    theirs = (have.get("metadata", {}).get("annotations") or {}).get(DESIRED_HASH)
    return ours == theirs and covers(want, have)


def plan(desired: Sequence[Manifest], actual: Iterable[Manifest]) -> Plan:
    """What converges `actual` (the job's children, read back) to `desired` (as built, unstamped):
    apply what is missing or drifted, delete what is ours but no longer wanted, and delete what must be
    replaced because a field it cannot change in place differs."""
    have = {key(obj): obj for obj in actual}
    apply: list[Manifest] = []
    delete: list[ObjectRef] = []
    unchanged: list[str] = []
    requeue = False
    for obj in desired:
        want = stamped(obj)
        current = have.get(key(obj))
        if current is None:
            apply.append(want)
            continue
        if current.get("metadata", {}).get("deletionTimestamp"):
            requeue = True  # still going away: create it again once it is gone
            continue
        path = immutable_change(want, current)
        if path is not None:
            delete.append(ObjectRef(obj["kind"], obj["metadata"]["name"], obj["apiVersion"],
                                    f"{'.'.join(path)} cannot change in place"))
            requeue = True
        elif in_sync(want, current):
            unchanged.append(f"{obj['kind']}/{obj['metadata']['name']}")
        else:
            apply.append(want)
    wanted = {key(obj) for obj in desired}
    for (kind, name), obj in sorted(have.items()):
        if (kind, name) not in wanted and not obj.get("metadata", {}).get("deletionTimestamp"):
            delete.append(ObjectRef(kind, name, obj.get("apiVersion", ""), "no longer desired"))
    return Plan(tuple(apply), tuple(delete), requeue, tuple(unchanged))


def scaled_to_zero(objects: Sequence[Manifest], roles: Collection[str] | None = None) -> list[Manifest]:
    """`objects` with every StatefulSet (of `roles`, None: all) at zero replicas: what a finished or
    failed job keeps (its Services, spec and volume claims stay; its pods, GPUs included, are released)."""
    out = []
    for obj in objects:
        role = obj["metadata"].get("labels", {}).get(COMPONENT_KEY)
        if obj["kind"] == "StatefulSet" and (roles is None or role in roles):
            obj = {**obj, "spec": {**obj["spec"], "replicas": 0}}
        out.append(obj)
    return out


def _spec_hash(obj: Manifest) -> str | None:
    meta = obj.get("spec", {}).get("template", {}).get("metadata", {}) if obj["kind"] == "StatefulSet" else \
        obj.get("metadata", {})
    found = (meta.get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
    return str(found) if found is not None else None


def _pods_read(obj: Manifest) -> dict[str, Any] | None:
    """The part of `obj` the job's pods run from: a StatefulSet's spec but its replicas, the ConfigMap's data."""
    if obj["kind"] == "StatefulSet":
        return {k: v for k, v in obj.get("spec", {}).items() if k != "replicas"}
    if obj["kind"] == "ConfigMap":
        return dict(obj.get("data") or {})
    return None


@dataclass(frozen=True)
class Source:
    """The RLJob a pass renders, as pinning compares it with what the pods were built for: its
    metadata.generation, what its spec hash reads as the API server stored it (`job`: spec and Kueue
    queue), and `same`: whether a recorded `job` hashes as this one under this release (False where it
    no longer validates)."""

    generation: int
    job: dict[str, Any]
    same: Callable[[Mapping[str, Any]], bool]


def applied_record(live: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The APPLIED annotation of `live` (what `pinned` recorded), None where it has none readable."""
    try:
        found = json.loads(((live or {}).get("metadata", {}).get("annotations") or {}).get(APPLIED, "null"))
    except ValueError:
        return None
    return found if isinstance(found, dict) and isinstance(found.get("content"), dict) else None


def _built_for_same(record: Mapping[str, Any], digest: str | None, source: Source | None) -> bool:
    """Whether `record` was written for the user's spec the job has now: the same hash (this release's
    rendering of it), else the same generation and queue (nobody wrote the spec since), else a recorded
    spec that hashes the same under this release (a scale, a respelling, an earlier release's hash)."""
    if record.get("hash") == digest:
        return True
    if source is None or not isinstance(record.get("job"), dict):
        return False
    recorded: Mapping[str, Any] = record["job"]
    if record.get("generation") == source.generation and recorded.get("queue") == source.job.get("queue"):
        return True
    return source.same(recorded)


def pinned(desired: Sequence[Manifest], actual: Iterable[Manifest], source: Source | None = None) -> list[Manifest]:
    """`desired` with what the job's pods run from kept as the operator last wrote it while the user's
    spec stays the same (`_built_for_same`): a StatefulSet's spec but its replicas, the spec ConfigMap's
    data. So a new operator release, whose builders render the same spec differently and whose defaults
    differ from those the API server stored in the job, restarts no pod and hands no running pod a
    spec.yaml its image cannot read; its rendering takes effect with the user's next change of what the
    spec hash reads. What was written is in each object's APPLIED annotation (as kubectl's
    last-applied-configuration) with the hash, generation and stored spec it was built for, so a hand
    edit is still repaired: to what the operator wrote, not to the live object."""
    have = {key(obj): obj for obj in actual}
    out = []
    for obj in desired:
        part = _pods_read(obj)
        if part is None:
            out.append(obj)
            continue
        digest = _spec_hash(obj)
        live = have.get(key(obj))
        record = applied_record(live)
        if record is not None and _built_for_same(record, digest, source):
            part = record["content"]
            if source is not None and "job" not in record:  # recorded by a release before generations
                record = {**record, "generation": source.generation, "job": source.job}
            applied = json.dumps(record, sort_keys=True, separators=(",", ":"))
        else:
            fresh: dict[str, Any] = {"hash": digest, "content": part}
            if source is not None:
                fresh.update(generation=source.generation, job=source.job)
            applied = json.dumps(fresh, sort_keys=True, separators=(",", ":"))
        meta = dict(obj["metadata"])
        meta["annotations"] = {**meta.get("annotations", {}), APPLIED: applied}
        if record is not None and part is record["content"] and SPEC_HASH_ANNOTATION in meta["annotations"]:
            meta["annotations"][SPEC_HASH_ANNOTATION] = record.get("hash")  # the spec it was built for
        if obj["kind"] == "StatefulSet":
            obj = {**obj, "metadata": meta, "spec": {**part, "replicas": obj["spec"].get("replicas")}}
        else:
            obj = {**obj, "metadata": meta, "data": part}
        out.append(obj)
    return out
