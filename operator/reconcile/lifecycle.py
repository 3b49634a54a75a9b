"""Where a job is in its life, from its spec, its last status and the clock: the suspend protocol, the
active deadline, the time to live after it finished. Pure: the reconciler reads, these decide.

Every start time is one the status already holds, so a pass needs no memory of its own and an
operator restart loses nothing: a suspension began when the Suspended condition turned True, a run
began (or resumed) when it turned False or, if later, when the Queued condition last turned False (its
pods let through Kueue's gate), a job finished when Complete or Failed turned True.

Suspend, the protocol: the controller StatefulSet goes to zero first. Its pod gets SIGTERM and, with
`controller.termination_grace_seconds` to do it in, finishes its step and checkpoints it
(workers/controller/stopping.py), then exits. The other roles keep running meanwhile, so that step
can finish. Once no controller pod is left (deleted: its checkpoint is on its volume claim), every
other role goes to zero. If the pod is still there SUSPEND_MARGIN_S after its grace period (a node
that stopped answering keeps a pod Terminating forever), the operator stops waiting and scales every
role to zero anyway; the Suspended condition says so (CheckpointTimedOut) until the job is resumed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from rhymerl.api.roles import ROLES

SUSPEND_MARGIN_S = 60  # past the controller's grace period, for the kubelet to report the pod gone
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
Stage = Literal["running", "checkpoint", "stopping"]


def parse_time(text: object) -> datetime | None:
    """An RFC 3339 time as the status holds it; None for anything else."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def format_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime(TIME_FORMAT)


def since(status: Mapping[str, Any], type_: str, value: str) -> datetime | None:
    """When condition `type_` of `status` last turned `value` (None: it is not `value`, or has no time)."""
    for c in status.get("conditions") or []:
        if c.get("type") == type_:
            return parse_time(c.get("lastTransitionTime")) if c.get("status") == value else None
    return None


def _reason(status: Mapping[str, Any], type_: str) -> str:
    found = [c for c in status.get("conditions") or [] if c.get("type") == type_]
    return str(found[0].get("reason") or "") if found else ""


@dataclass(frozen=True)
class Suspension:
    """`stage`: running (not suspended), checkpoint (only the controller scaled to zero, waiting for its
    pod to go) or stopping (every role scaled to zero). `timed_out`: the wait for the controller pod
    ran out (at `deadline`) before it went."""

    stage: Stage = "running"
    deadline: datetime | None = None
    timed_out: bool = False
    grace_s: int = 0
    wait_s: float | None = None  # until the deadline, while waiting for the controller pod

    def zero(self) -> tuple[str, ...]:
        """The roles whose StatefulSets are scaled to zero in this stage."""
        return {"running": (), "checkpoint": ("controller",), "stopping": tuple(ROLES)}[self.stage]


def suspension(suspend: bool, previous: Mapping[str, Any], controller_pods: int, grace_s: int,
               now: datetime) -> Suspension:
    """Where the suspend protocol stands (see the module's docstring). `controller_pods`: the job's
    controller pods that exist, terminating ones included; `grace_s`: the controller pod's grace period."""
    if not suspend:
        return Suspension()
    began = since(previous, "Suspended", "True") or now
    deadline = began + timedelta(seconds=grace_s + SUSPEND_MARGIN_S)
    timed_out = _reason(previous, "Suspended") == "CheckpointTimedOut" or (controller_pods > 0 and now >= deadline)
    if controller_pods > 0 and not timed_out:
        return Suspension("checkpoint", deadline, False, grace_s, (deadline - now).total_seconds())
    return Suspension("stopping", deadline, timed_out, grace_s)


@dataclass(frozen=True)
class Deadline:
    """spec.active_deadline_seconds against the time the job has run since it started or resumed."""

    exceeded: str | None = None  # the Failed condition's message, once exceeded
    wait_s: float | None = None  # until it is, while running


def deadline(limit_s: int | None, suspend: bool, previous: Mapping[str, Any], now: datetime) -> Deadline:
    """A suspended job's clock is stopped (and starts again from zero when it resumes, as a Job's); so is
    the clock of a job whose pods all wait for Kueue's admission (Queued True, kueue.py), which starts
    again from zero when they are admitted, as a Job's does when Kueue unsuspends it."""
    if limit_s is None or suspend or since(previous, "Queued", "True") is not None:
        return Deadline()
    starts = [t for t in (since(previous, "Suspended", "False"), since(previous, "Queued", "False")) if t is not None]
    started = max(starts) if starts else now
    left = (started + timedelta(seconds=limit_s) - now).total_seconds()
    if left > 0:
        return Deadline(None, left)
    return Deadline(f"running since {format_time(started)}, longer than spec.activeDeadlineSeconds {limit_s}; "
                    "every role is scaled to zero (raise active_deadline_seconds, or suspend and resume, to go on "
                    "from the last checkpoint)")


def finished_at(previous: Mapping[str, Any]) -> datetime | None:
    """When the job Succeeded or Failed (None: it has not)."""
    if previous.get("phase") not in ("Succeeded", "Failed"):
        return None
    times = [t for t in (since(previous, "Complete", "True"), since(previous, "Failed", "True")) if t is not None]
    return min(times) if times else None


def ttl_left(ttl_s: int | None, previous: Mapping[str, Any], now: datetime) -> float | None:
    """Seconds until a finished job is deleted (<= 0: now); None when it is not to be deleted (yet)."""
    done = finished_at(previous)
    if ttl_s is None or done is None:
        return None
    return (done + timedelta(seconds=ttl_s) - now).total_seconds()


def sooner(*waits: float | None) -> float | None:
    """The first of `waits` to come (None: none)."""
    found: Sequence[float] = [w for w in waits if w is not None]
    return max(0.0, min(found)) if found else None
