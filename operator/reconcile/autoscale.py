"""How many rollout pods a job with spec.rollout.autoscaling runs: the controller's recommendation
(status.progress.recommendedRolloutWorkers) within min_replicas and max_replicas, moved at most
`max_step` pods at a time and at most once per `cooldown_seconds`. Pure: a function of the spec, the
status and the clock; the reconciler applies it to the rollout StatefulSet.

Everything a decision needs is in the status (status.autoscaling: the count and when it last
changed), so an operator restart forgets nothing. A scale-up waits while rollout pods cannot be
scheduled (asking for more of what the cluster has none of helps nobody: the job goes on with what
it has). A scale-down removes the highest ordinals (a StatefulSet's order; it ignores
controller.kubernetes.io/pod-deletion-cost, which only ReplicaSets read): the controller reads the count
decided here (status.autoscaling.replicas) and moves its workers off those pods first, and the reconciler
lowers the StatefulSet once they are drained (drain.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rhymerl.api.rollout import RolloutSpec
from rhymerl.api.status import AutoscalingStatus
from rhymerl.operator.manifests import rollout_replicas
from rhymerl.operator.manifests.labels import COMPONENT_KEY
from rhymerl.operator.reconcile.lifecycle import format_time, parse_time

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Decision:
    """`status`: status.autoscaling as it is to be written (its replicas: the rollout pod count now);
    `wait_s`: when to look again (a change the cooldown holds back), None: no need."""

    status: AutoscalingStatus
    wait_s: float | None = None


def _previous(status: Mapping[str, Any]) -> AutoscalingStatus | None:
    found = status.get("autoscaling")
    try:
        return AutoscalingStatus.model_validate(found) if isinstance(found, Mapping) else None
    except ValueError:  # hand-edited: start again from the spec
        return None


def decide(rollout: RolloutSpec, status: Mapping[str, Any], unschedulable: int, now: datetime) -> Decision | None:
    """The rollout pod count of a job whose spec.rollout is `rollout` and whose status is `status`;
    `unschedulable`: its rollout pods the scheduler finds no node for. None: autoscaling is off."""
    auto = rollout.autoscaling
    if not auto.enabled:
        return None
    low, high = rollout.min_replicas, rollout.max_replicas
    before = _previous(status)
    current = rollout_replicas(rollout) if before is None else min(max(before.replicas, low), high)
    changed = None if before is None else parse_time(before.lastScaleTime)
    recommended = ((status.get("progress") or {}).get("recommendedRolloutWorkers"))
    if not isinstance(recommended, int) or isinstance(recommended, bool):
        return Decision(_kept(current, changed, f"{current} rollout pods: no recommendation from the "
                              "controller yet (it gives one after each step)"))
    target = min(max(recommended, low), high)
    bounded = "" if target == recommended else f" (the controller recommends {recommended}; bounds {low}-{high})"
    if target == current:
        return Decision(_kept(current, changed, f"{current} rollout pods, as recommended{bounded}"))
    if target > current and unschedulable:
        return Decision(_kept(current, changed, f"{current} rollout pods, {target} recommended{bounded}: "
                              f"holding while {unschedulable} rollout pods wait for a node (capacity is short)"))
    if changed is not None and auto.cooldown_seconds:
        ready_at = changed + timedelta(seconds=auto.cooldown_seconds)
        if now < ready_at:
            return Decision(_kept(current, changed, f"{current} rollout pods, {target} recommended{bounded}: "
                                  f"cooldown until {format_time(ready_at)} (cooldown_seconds "
                                  f"{auto.cooldown_seconds})"), (ready_at - now).total_seconds())
    step = max(-auto.max_step, min(auto.max_step, target - current))
    moved = current + step
    rest = "" if moved == target else f", {target - moved:+d} more after the cooldown (max_step {auto.max_step})"
    return Decision(AutoscalingStatus(replicas=moved, lastScaleTime=format_time(now),
                                      message=f"{current} -> {moved} rollout pods, {target} recommended{bounded}{rest}"))


def _kept(current: int, changed: datetime | None, message: str) -> AutoscalingStatus:
    return AutoscalingStatus(replicas=current, lastScaleTime="" if changed is None else format_time(changed),
                             message=message)


def with_rollout_replicas(objects: Sequence[Manifest], count: int) -> list[Manifest]:
    """`objects` with the rollout StatefulSet at `count` replicas, unless it is at zero (a suspended,
    finished or failed job keeps none)."""
    out = []
    for obj in objects:
        if (obj["kind"] == "StatefulSet" and obj["metadata"].get("labels", {}).get(COMPONENT_KEY) == "rollout"
                and int(obj["spec"].get("replicas") or 0) > 0):
            obj = {**obj, "spec": {**obj["spec"], "replicas": count}}
        out.append(obj)
    return out
