"""When the rollout StatefulSet may go down: only once the pods it removes hold no rollout worker. Pure: a
function of the count wanted, the count there is, the status and the clock; the reconciler applies it.

A StatefulSet removes its highest ordinals and no annotation changes that (pod-deletion-cost is read by
ReplicaSets only), so the operator cannot pick the pods with the least work left. It does the next best
thing: it drains the pods that will go before removing them. The channel is the one the controller
already has: it reads its RLJob every 10 s (spec.rollout.replicas, or status.autoscaling.replicas with
autoscaling on) and retires the workers on the ordinals above that count first (they hand their samples
back with their tokens, the fleet moves them to the workers that stay, and no new sample is dealt to them);
it reports in status.progress.rolloutPodsInUse how many leading ordinals hold its workers. The operator
holds the StatefulSet at its count meanwhile and lowers it once that report is at or below the count
wanted, or once DRAIN_MARGIN_S past the rollout pods' grace period have gone by (a controller that does
not report: its pods' workers then hand their samples back on SIGTERM, as before). The Draining
condition holds the drain's start (its lastTransitionTime while True) and says how it ended: Drained
(the controller's report) or DrainTimedOut (the wait).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from rhymerl.operator.reconcile.lifecycle import format_time, since

DRAIN_MARGIN_S = 60  # past the rollout pods' grace: the controller's spec read (10 s), a pass, a step's end
Status = Literal["True", "False"]


@dataclass(frozen=True)
class Drain:
    """`replicas`: the rollout StatefulSet's count to apply; the Draining condition's status, reason and
    message; `wait_s`: when to look again (the end of the wait), None: no need."""

    replicas: int
    status: Status
    reason: str
    message: str
    wait_s: float | None = None


def _pods(statefulset: str, low: int, high: int) -> str:
    names = [f"{statefulset}-{i}" for i in range(low, high)]
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} .. {names[-1]}"


def in_use(status: Mapping[str, Any]) -> int | None:
    """status.progress.rolloutPodsInUse as the controller reported it (None: never, or not a count)."""
    found = (status.get("progress") or {}).get("rolloutPodsInUse")
    return found if isinstance(found, int) and not isinstance(found, bool) and found >= 0 else None


def drain(statefulset: str, current: int, wanted: int, status: Mapping[str, Any], grace_s: int,
          now: datetime) -> Drain:
    """The rollout StatefulSet `statefulset` runs `current` pods and the job wants `wanted`; `status`: the
    job's status as last written; `grace_s`: the rollout pods' grace period."""
    previous: Mapping[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Draining"), {})
    if wanted >= current or wanted == 0:  # nothing to drain: a scale-up, or every role goes (suspend, finish)
        if previous.get("status") == "False" and previous.get("reason") in ("Drained", "DrainTimedOut"):
            return Drain(wanted, "False", str(previous["reason"]), str(previous.get("message") or ""))
        return Drain(wanted, "False", "NotDraining", "no rollout pod is being drained")
    pods = _pods(statefulset, wanted, current)
    began = since(status, "Draining", "True") or now
    reported = in_use(status)
    if reported is not None and reported <= wanted:
        return Drain(wanted, "False", "Drained", f"{current} -> {wanted} rollout pods once the controller had "
                     f"moved its workers off {pods} (rolloutPodsInUse {reported}): no sample was taken away")
    until = began + timedelta(seconds=grace_s + DRAIN_MARGIN_S)
    if now >= until:
        return Drain(wanted, "False", "DrainTimedOut", f"{current} -> {wanted} rollout pods without the "
                     f"controller's report by {format_time(until)} (rolloutPodsInUse "
                     f"{'not reported' if reported is None else reported}): the workers on {pods} hand their "
                     "samples back on SIGTERM")
    return Drain(current, "True", "Draining", f"{current} -> {wanted} rollout pods: the controller moves its "
                 f"workers off {pods} first; they go once it reports them drained, or at {format_time(until)} "
                 f"(rollout.termination_grace_seconds {grace_s} s plus {DRAIN_MARGIN_S} s)",
                 (until - now).total_seconds())
