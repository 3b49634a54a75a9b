"""An RLJob's status from what its pods say: phase, conditions, per-role counts. Pure.

Conditions follow metav1.Condition: one per type (Ready, RolloutReady, TrainReady, Degraded,
Suspended, Complete, Failed, Draining), each with a CamelCase reason and a message a person can act on.
lastTransitionTime moves only when a condition's status flips, so recomputing the status of an
unchanged job gives the same object and the operator writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rhymerl.api.roles import ROLES
from rhymerl.api.status import (
    CONDITION_TYPES,
    AutoscalingStatus,
    Condition,
    Failures,
    Phase,
    RLJobStatus,
    RoleStatus,
)
from rhymerl.operator.reconcile import kueue
from rhymerl.operator.reconcile.lifecycle import SUSPEND_MARGIN_S, Suspension, format_time
from rhymerl.operator.reconcile.pods import MEMBER_LOST_LIMIT, PodView

Status = Literal["True", "False", "Unknown"]
MAX_LISTED = 3  # pods named in one message


@dataclass(frozen=True)
class Observation:
    """Everything the status is computed from."""

    generation: int
    suspend: bool
    backoff_limit: int
    desired: Mapping[str, int]  # pods wanted per role now (zero for every role when suspended or stopped)
    pods: Sequence[PodView]
    failures: Failures  # after counting this pass
    finished: bool  # the controller pod reported the last step done (status.progress.finished)
    invalid: str | None = None  # the spec's problems, when it does not validate
    selector: str = ""  # of the rollout pods
    refused: tuple[str, ...] = ()  # children the API server would not write: "Kind/name: its message"
    token_pending: str | None = None  # why the pods wait for the job's own Ray token Secret (token.py)
    pods_refused: tuple[str, ...] = ()  # missing pods the API server refused at admission: "pod X: message"
    suspension: Suspension = field(default_factory=Suspension)  # where the suspend protocol stands (lifecycle.py)
    deadline_exceeded: str | None = None  # spec.active_deadline_seconds passed: why
    autoscaling: AutoscalingStatus | None = None  # spec.rollout.autoscaling's decision (autoscale.py), when on
    draining: tuple[Status, str, str] = ("False", "NotDraining", "no rollout pod is being drained")  # drain.py


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event about the RLJob."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def over_budget(failures: Failures, backoff_limit: int) -> bool:
    """More crashes than spec.failure_policy.backoff_limit tolerates: the job has Failed."""
    return failures.crashes > backoff_limit


def ready_counts(pods: Sequence[PodView]) -> dict[str, int]:
    out: dict[str, int] = dict.fromkeys(ROLES, 0)
    for pod in pods:
        if pod.ready and pod.role in out:
            out[pod.role] += 1
    return out


def _listed(items: Sequence[str]) -> str:
    more = len(items) - MAX_LISTED
    return "; ".join(items[:MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")


def _role_ready(role: str, desired: int, ready: int, label: str) -> tuple[Status, str, str]:
    if desired == 0:
        return "False", "ScaledToZero", f"no {label} pods wanted"
    if ready >= desired:
        return "True", "AllReplicasReady", f"{min(ready, desired)}/{desired} {label} pods ready"
    return "False", "ReplicasNotReady", f"{ready}/{desired} {label} pods ready"


def _rollout_ready(obs: Observation, ready: int) -> tuple[Status, str, str]:
    """RolloutReady; CapacityShort when rollout pods wait for a node (spot capacity gone): the job goes on
    with the rollout workers it has (the fleet runs with those that joined)."""
    desired = obs.desired.get("rollout", 0)
    waiting = [p.name for p in obs.pods if p.role == "rollout" and p.unschedulable and not p.deleting]
    if not waiting or ready >= desired:
        return _role_ready("rollout", desired, ready, "rollout")
    goes_on = f"the job goes on with {ready}" if ready else "the job waits for one"
    return ("False", "CapacityShort", f"{ready}/{desired} rollout pods ready; {len(waiting)} wait for a node "
            f"({_listed(sorted(waiting))}): {goes_on}")


def _degraded(obs: Observation) -> tuple[Status, str, str]:
    """The most urgent thing keeping pods from running, naming the pods (or the children not written)."""
    if obs.refused:
        return "True", "ApplyFailed", _listed(list(obs.refused))
    if obs.token_pending is not None:
        return "True", "RayTokenPending", obs.token_pending
    if obs.pods_refused:
        return "True", "PodsRefused", _listed(list(obs.pods_refused))
    live = [p for p in obs.pods if not p.deleting]
    unschedulable = [f"pod {p.name}: {p.unschedulable}" for p in live if p.unschedulable]
    if unschedulable:
        return "True", "Unschedulable", _listed(unschedulable)
    waiting = [f"pod {p.name}: {p.waiting}" for p in live if p.waiting]
    if waiting:
        return "True", "ContainerCannotStart", _listed(waiting)
    crashing = [f"pod {p.name}: {p.crash or 'container restarting'}" for p in live
                if p.crash_looping or (p.crash is not None and not p.ready)]
    if crashing:
        budget = f"{obs.failures.crashes} crashes counted, backoff_limit {obs.backoff_limit}"
        return "True", "CrashLoop", f"{_listed(crashing)} ({budget})"
    lost = [p.name for p in live if p.member_lost and not p.ready]
    if lost:
        return "True", "MemberLost", (f"{_listed(lost)}: restarted after the run lost a member (a pod evicted, drained "
                                      "or crashed; counted on that pod): it resumes from the last checkpoint once the "
                                      f"pods are back ({_unexplained(obs.failures)})")
    return "False", "AsExpected", "every pod is scheduled and running"


def _unexplained(f: Failures) -> str:
    return (f"{f.unexplainedMemberLoss} such restarts in a row with no member pod preempted or crashing; past "
            f"{MEMBER_LOST_LIMIT} each counts as a crash")


def _suspended(obs: Observation) -> tuple[Status, str, str]:
    if not obs.suspend:
        return "False", "NotSuspended", "spec.suspend is false"
    s = obs.suspension
    until = format_time(s.deadline) if s.deadline is not None else "?"
    remaining = sorted(p.name for p in obs.pods)
    waiting = f"waiting for {len(remaining)} pods to stop ({_listed(remaining)})" if remaining else \
        "every role is scaled to zero"
    if s.stage == "checkpoint":
        return ("True", "CheckpointPending", f"the controller pod finishes its step and checkpoints it (SIGTERM); "
                f"the other roles are scaled to zero once it is gone, or at {until} (its grace period "
                f"controller.termination_grace_seconds {s.grace_s} s plus {SUSPEND_MARGIN_S} s) at the latest")
    if s.timed_out:
        return ("True", "CheckpointTimedOut", f"the controller pod was not gone by {until}: every role was scaled "
                f"to zero without waiting for its checkpoint; {waiting}; set spec.suspend to false to resume from "
                "the last checkpoint it completed")
    if remaining:
        return "True", "ScalingDown", f"the controller pod stopped after its checkpoint; {waiting}"
    return "True", "Suspended", "every role is scaled to zero; set spec.suspend to false to resume from the last checkpoint"


def _failed(obs: Observation) -> tuple[Status, str, str]:
    if obs.invalid is not None:
        return "True", "InvalidSpec", obs.invalid
    f = obs.failures
    if over_budget(f, obs.backoff_limit):
        return ("True", "BackoffLimitExceeded", f"{f.crashes} crashes exceed spec.failurePolicy.backoffLimit "
                f"{obs.backoff_limit}; last: {f.lastFailure}; every role is scaled to zero (raise backoff_limit "
                "to resume from the last checkpoint)")
    if obs.deadline_exceeded is not None:
        return "True", "DeadlineExceeded", obs.deadline_exceeded
    unexplained = f"; controller: {_unexplained(f)}" if f.unexplainedMemberLoss else ""
    return "False", "WithinBackoffLimit", (f"{f.crashes} crashes counted, backoff_limit {obs.backoff_limit}; "
                                           f"{f.preemptions} preemptions (not counted){unexplained}")


def conditions(obs: Observation) -> list[Condition]:
    """Every condition type, in CONDITION_TYPES order, without lastTransitionTime (see `with_times`)."""
    ready = ready_counts(obs.pods)
    parts: dict[str, tuple[Status, str, str]] = {}
    parts["RolloutReady"] = _rollout_ready(obs, ready["rollout"])
    parts["TrainReady"] = _role_ready("train", obs.desired.get("train", 0), ready["train"], "train")
    parts["Degraded"] = kueue.degraded(obs.pods, _degraded(obs))
    parts["Queued"] = kueue.queued(obs.pods)
    parts["Suspended"] = _suspended(obs)
    parts["Complete"] = (("True", "Finished", "the controller reported the last step done") if obs.finished else
                         ("False", "InProgress", "not finished"))
    parts["Failed"] = _failed(obs)
    parts["Draining"] = obs.draining
    wanted = {role: n for role, n in obs.desired.items() if n > 0}
    short = [f"{role} {ready[role]}/{n}" for role, n in wanted.items() if ready[role] < n]
    if parts["Failed"][0] == "True":
        parts["Ready"] = ("False", parts["Failed"][1], "the job has failed (see the Failed condition)")
    elif obs.finished:
        parts["Ready"] = ("False", "Finished", "the job has finished")
    elif obs.suspend:
        parts["Ready"] = ("False", "Suspended", "the job is suspended")
    elif not wanted:
        parts["Ready"] = ("False", "ScaledToZero", "no pods wanted")
    elif short and obs.pods_refused:
        parts["Ready"] = ("False", "PodsRefused", f"pods ready: {', '.join(short)}; the API server refused "
                          f"{len(obs.pods_refused)} pods at admission (see the Degraded condition)")
    elif gated := sorted({g for p in obs.pods if not p.deleting for g in p.gated}):
        held = sum(1 for p in obs.pods if p.gated and not p.deleting)
        parts["Ready"] = ("False", "SchedulingGated", f"{held} pods wait for their scheduling gates to be removed "
                          f"({', '.join(gated)}: Kueue admits the job's pod group whole, once it fits its queue)")
    elif short:
        parts["Ready"] = ("False", "RolesNotReady", "pods ready: " + ", ".join(short))
    else:
        parts["Ready"] = ("True", "AllRolesReady", "pods ready: " + ", ".join(f"{r} {n}/{n}" for r, n in wanted.items()))
    return [Condition(type=t, status=parts[t][0], reason=parts[t][1], message=parts[t][2],
                      observedGeneration=obs.generation) for t in CONDITION_TYPES]


def phase(obs: Observation, conds: Sequence[Condition]) -> Phase:
    """Failed > Succeeded > Suspended > Running > Pending. Running: the step loop can make progress
    (the controller and every fixed-size role fully ready, and at least one rollout pod)."""
    by_type = {c.type: c for c in conds}
    if by_type["Failed"].status == "True":
        return "Failed"
    if by_type["Complete"].status == "True":
        return "Succeeded"
    if obs.suspend:
        return "Suspended"
    ready = ready_counts(obs.pods)
    wanted = {role: n for role, n in obs.desired.items() if n > 0}
    if wanted.get("controller", 0) and all(ready[r] >= (1 if r == "rollout" else n) for r, n in wanted.items()):
        return "Running"
    return "Pending"


def with_times(new: Sequence[Condition], previous: Sequence[Mapping[str, Any]], now: str) -> list[Condition]:
    """`new` with lastTransitionTime kept from `previous` where the status did not flip, `now` elsewhere."""
    before = {c.get("type"): c for c in previous}
    out = []
    for cond in new:
        old = before.get(cond.type)
        kept = old is not None and old.get("status") == cond.status and old.get("lastTransitionTime")
        out.append(cond.model_copy(update={"lastTransitionTime": old["lastTransitionTime"] if kept and old else now}))
    return out


def status(obs: Observation, previous: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The operator's part of status (everything but `progress`) as it is written and read back."""
    conds = with_times(conditions(obs), previous.get("conditions") or [], now)
    ready = ready_counts(obs.pods)
    out = RLJobStatus(
        phase=phase(obs, conds), observedGeneration=obs.generation, conditions=conds,
        roles={role: RoleStatus(desired=obs.desired.get(role, 0), ready=ready[role]) for role in ROLES},
        replicas=ready["rollout"], selector=obs.selector, failures=obs.failures, autoscaling=obs.autoscaling,
    )
    return out.model_dump(mode="json", exclude={"progress"} | ({"autoscaling"} if obs.autoscaling is None else set()))


def operator_part(current: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a status as read back that `status` writes (so the two can be compared)."""
    return {k: v for k, v in current.items() if k in RLJobStatus.model_fields and k != "progress"}


def transitions(previous: Sequence[Mapping[str, Any]], new: Sequence[Condition]) -> list[Event]:
    """An Event for every condition whose status flipped, or that is True with a new reason. Degraded
    and Failed turning True are Warnings; the rest are Normal. A new job announces only what is True."""
    before = {c.get("type"): c for c in previous}
    events = []
    for cond in new:
        old = before.get(cond.type)
        if old is None:
            changed = cond.status == "True"
        else:
            changed = old.get("status") != cond.status or (cond.status == "True" and old.get("reason") != cond.reason)
        if changed:
            bad = cond.type in ("Degraded", "Failed") and cond.status == "True"
            events.append(Event("Warning" if bad else "Normal", cond.reason, f"{cond.type}={cond.status}: {cond.message}"))
    return events
