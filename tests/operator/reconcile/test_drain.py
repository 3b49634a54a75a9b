"""A rollout scale-down drains the pods that go first (operator/reconcile/drain.py), by hand: the count holds
until the controller reports its workers off them or the wait ends, and the Draining condition says which."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rhymerl.operator.reconcile.drain import drain

NOW = datetime(2026, 11, 26, 10, 0, 0, tzinfo=UTC)
GRACE_S = 60  # rollout.termination_grace_seconds: the wait is that plus DRAIN_MARGIN_S 60


def status(in_use: int | None = None, draining_since: str | None = None, **last: str) -> dict[str, Any]:
    out: dict[str, Any] = {"progress": {} if in_use is None else {"rolloutPodsInUse": in_use}, "conditions": []}
    if draining_since is not None:
        out["conditions"].append({"type": "Draining", "status": "True", "reason": "Draining",
                                  "lastTransitionTime": draining_since})
    elif last:
        out["conditions"].append({"type": "Draining", "status": "False", **last})
    return out


def test_a_scale_down_holds_the_count_until_the_pods_that_go_are_drained() -> None:
    d = drain("alpha-rollout", 6, 4, status(in_use=6), GRACE_S, NOW)
    assert (d.replicas, d.status, d.reason) == (6, "True", "Draining")
    assert "moves its workers off alpha-rollout-4, alpha-rollout-5 first" in d.message
    assert "at 2026-11-26T10:02:00Z" in d.message  # 60 s grace + 60 s
    assert d.wait_s == 120


def test_the_wait_counts_from_when_draining_began_not_from_each_pass() -> None:
    d = drain("alpha-rollout", 6, 4, status(in_use=5, draining_since="2026-11-26T09:59:00Z"), GRACE_S, NOW)
    assert (d.replicas, d.status, d.wait_s) == (6, "True", 60)


def test_the_controllers_report_lets_the_count_go_down_and_the_condition_says_so() -> None:
    d = drain("alpha-rollout", 6, 4, status(in_use=4, draining_since="2026-11-26T09:59:30Z"), GRACE_S, NOW)
    assert (d.replicas, d.status, d.reason, d.wait_s) == (4, "False", "Drained", None)
    assert d.message.startswith("6 -> 4 rollout pods once the controller had moved its workers off")


def test_without_a_report_the_count_goes_down_when_the_wait_ends() -> None:
    d = drain("alpha-rollout", 6, 2, status(draining_since="2026-11-26T09:58:00Z"), GRACE_S, NOW)
    assert (d.replicas, d.status, d.reason) == (2, "False", "DrainTimedOut")
    assert "(rolloutPodsInUse not reported): the workers on alpha-rollout-2 .. alpha-rollout-5 hand" in d.message


def test_a_scale_up_or_a_stop_drains_nothing_and_the_last_outcome_stays_said() -> None:
    assert drain("alpha-rollout", 2, 4, status(), GRACE_S, NOW).reason == "NotDraining"
    assert drain("alpha-rollout", 4, 0, status(in_use=4), GRACE_S, NOW).replicas == 0  # suspend, finish: at once
    kept = drain("alpha-rollout", 4, 4, status(reason="Drained", message="6 -> 4 ..."), GRACE_S, NOW)
    assert (kept.replicas, kept.status, kept.reason, kept.message) == (4, "False", "Drained", "6 -> 4 ...")
    called_off = drain("alpha-rollout", 6, 6, status(in_use=6, draining_since="2026-11-26T09:59:00Z"), GRACE_S, NOW)
    assert (called_off.replicas, called_off.reason) == (6, "NotDraining")
