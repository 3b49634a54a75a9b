"""An RLJob as the API server stores it -> the validated spec, or the problems naming each field. Pure.

The CRD schema and its CEL rules stop most bad jobs at admission, but not all (a CRD installed without
them, an older CRD, a rule pydantic has and CEL cannot say): such a job gets Failed/InvalidSpec with
the messages `rhymerl validate` prints, and no children. The one field fixed up instead of refused is
spec.rollout.replicas, which `kubectl scale` and autoscalers write: it is clamped to
[minReplicas, maxReplicas], as the builders would do. Fields are read in either spelling (the CRD's
camelCase, or the snake_case of an object stored before it: docs/operations.md, "Upgrading").
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rhymerl.api.load import problems_from, size_problems
from rhymerl.api.rollout import RolloutSpec
from rhymerl.api.spec import RLJob

_METADATA = ("name", "namespace", "labels", "annotations")


@dataclass(frozen=True)
class Parsed:
    job: RLJob | None
    problems: str | None  # "spec.a.b: reason; ..." when job is None
    clamped_from: int | None = None  # spec.rollout.replicas as written, when it was out of bounds


def _default(field: str) -> int:
    value = RolloutSpec.model_fields[field].default
    assert isinstance(value, int)
    return value


def clamp_replicas(spec: dict[str, Any]) -> int | None:
    """Clamp spec.rollout.replicas (in place) into [min_replicas, max_replicas]; returns the value as
    written when it was out of bounds. Anything that is not an integer is left for validation to name."""
    rollout = spec.get("rollout")
    if not isinstance(rollout, dict):
        return None
    wanted, low, high = (_default(name) if (value := RolloutSpec.written(rollout, name)) is None else value
                         for name in ("replicas", "min_replicas", "max_replicas"))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (wanted, low, high)) or low > high:
        return None
    clamped = max(low, min(wanted, high))
    if clamped == wanted:
        return None
    rollout["replicas"] = clamped
    return int(wanted)


def parse(body: Mapping[str, Any]) -> Parsed:
    """Validate the RLJob `body` (apiVersion, kind, metadata, spec, as read from the API server)."""
    meta = body.get("metadata") or {}
    spec = copy.deepcopy(body.get("spec"))
    clamped = clamp_replicas(spec) if isinstance(spec, dict) else None
    doc = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
           "metadata": {k: meta[k] for k in _METADATA if meta.get(k) is not None}, "spec": spec}
    try:
        job = RLJob.model_validate(doc)
    except ValidationError as exc:
        return Parsed(None, "; ".join(str(p) for p in problems_from(exc, {}, doc=doc)), clamped)
    too_big = size_problems(job)
    return Parsed(None, "; ".join(map(str, too_big)), clamped) if too_big else Parsed(job, None, clamped)
