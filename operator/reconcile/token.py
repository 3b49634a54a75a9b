"""Whose is the Ray token Secret `<job>-ray-token`: this job's, or an earlier job's of the same name. Pure.

The Secret's name is fixed (the pods mount it by name) and the operator may create Secrets, never
read them, so a create answered 409 does not say whose the Secret is. A job deleted and created again
under its name races the garbage collector: the earlier job's Secret (its token, owned by the
earlier uid) may still be there when the new job's first pass creates its own. So the operator
records on the job's spec ConfigMap (owned by the job's uid) that it created the token for that uid
(RECORD), and the job's StatefulSets wait until that is so: an existing Secret with no such record
is someone else's, never taken over, and the create is tried again (the earlier job's goes with the
garbage collector; a person's must be deleted by a person). A job whose StatefulSets already exist
(made by an operator before this record) keeps the token they run with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rhymerl.operator.manifests.access import ray_token_name
from rhymerl.operator.manifests.roles import child_name

RECORD = "rhymerl.io/ray-token-for"  # on the spec ConfigMap: the job uid its token Secret was created for
WAIT_YOUNG_S, WAIT_OLD_S = 5.0, 60.0  # between tries: the garbage collector takes seconds; a person longer
YOUNG_S = 300.0  # a job this young is likely waiting on the garbage collector


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


@dataclass(frozen=True)
class Token:
    ours: bool
    message: str | None = None  # why the job waits, while it is not ours
    wait_s: float | None = None  # when to try the create again


def recorded(job: str, uid: str, children: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the live children say the token is job `uid`'s: its spec ConfigMap records it, or a
    StatefulSet of the job already runs with it."""
    for obj in children:
        if not _owned_by(obj, uid):
            continue
        if obj["kind"] == "StatefulSet":
            return True
        annotations = obj.get("metadata", {}).get("annotations") or {}
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == child_name(job, "spec") and \
                annotations.get(RECORD) == uid:
            return True
    return False


def decide(job: str, uid: str, created: bool, known: bool, age_s: float) -> Token:
    """`created`: this pass created the Secret; `known`: `recorded` says it is ours; `age_s`: the job's age."""
    if created or known:
        return Token(True)
    name = ray_token_name(job)
    return Token(False, f"Secret {name} exists and was not created for this job (uid {uid}): its pods wait for the "
                 "garbage collector to remove an earlier job's of the same name (delete it by hand if it is yours), "
                 "then get the token the operator creates for them", WAIT_YOUNG_S if age_s < YOUNG_S else WAIT_OLD_S)


def with_record(objects: Sequence[dict[str, Any]], job: str, uid: str) -> list[dict[str, Any]]:
    """`objects` with the spec ConfigMap recording that the token is job `uid`'s."""
    out = []
    for obj in objects:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == child_name(job, "spec"):
            meta = {**obj["metadata"], "annotations": {**obj["metadata"].get("annotations", {}), RECORD: uid}}
            obj = {**obj, "metadata": meta}
        out.append(obj)
    return out


def held(objects: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`objects` without the StatefulSets: no pod mounts a token that is not the job's."""
    return [obj for obj in objects if obj["kind"] != "StatefulSet"]
