"""The lifecycle decisions, from a status and a forced clock: which step of the suspend protocol a job is
in, when its active deadline passes, when its time to live after finishing runs out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from rhymerl.operator.reconcile.lifecycle import SUSPEND_MARGIN_S, deadline, sooner, suspension, ttl_left

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)


def _status(phase: str = "Running", **conditions: tuple[str, str, datetime]) -> dict[str, Any]:
    return {"phase": phase, "conditions": [
        {"type": t, "status": s, "reason": r, "lastTransitionTime": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
        for t, (s, r, when) in conditions.items()]}


def test_a_suspension_waits_for_the_controller_pod_until_its_grace_and_a_margin_then_stops_every_role() -> None:
    began = _status(Suspended=("True", "CheckpointPending", T0))
    waiting = suspension(True, began, 1, 900, T0 + timedelta(seconds=100))
    assert (waiting.stage, waiting.zero(), waiting.timed_out) == ("checkpoint", ("controller",), False)
    assert waiting.wait_s == 900 + SUSPEND_MARGIN_S - 100
    gone = suspension(True, began, 0, 900, T0 + timedelta(seconds=100))
    assert (gone.stage, gone.timed_out, len(gone.zero())) == ("stopping", False, 5)
    late = suspension(True, began, 1, 900, T0 + timedelta(seconds=900 + SUSPEND_MARGIN_S))
    assert (late.stage, late.timed_out, late.wait_s) == ("stopping", True, None)
    after = _status(Suspended=("True", "CheckpointTimedOut", T0))  # the pod went since: still said
    assert suspension(True, after, 0, 900, T0 + timedelta(hours=1)).timed_out
    assert suspension(False, after, 1, 900, T0).zero() == ()


def test_a_job_created_suspended_has_no_controller_pod_to_wait_for() -> None:
    first = suspension(True, {}, 0, 900, T0)
    assert (first.stage, first.deadline) == ("stopping", T0 + timedelta(seconds=900 + SUSPEND_MARGIN_S))


def test_the_active_deadline_counts_from_the_last_start_or_resume_and_not_while_suspended() -> None:
    resumed = _status(Suspended=("False", "NotSuspended", T0))
    running = deadline(600, False, resumed, T0 + timedelta(seconds=599))
    assert (running.exceeded, running.wait_s) == (None, 1.0)
    over = deadline(600, False, resumed, T0 + timedelta(seconds=600))
    assert over.exceeded is not None and over.exceeded.startswith(
        "running since 2026-11-26T10:00:00Z, longer than spec.activeDeadlineSeconds 600")
    assert deadline(600, True, resumed, T0 + timedelta(days=1)).exceeded is None
    assert deadline(None, False, resumed, T0 + timedelta(days=1)).exceeded is None
    assert deadline(600, False, {}, T0).wait_s == 600.0  # the first pass: starting now


def test_the_time_to_live_counts_from_when_the_job_succeeded_or_failed() -> None:
    done = _status("Succeeded", Complete=("True", "Finished", T0), Failed=("False", "WithinBackoffLimit", T0))
    assert ttl_left(60, done, T0 + timedelta(seconds=59)) == 1.0
    assert ttl_left(60, done, T0 + timedelta(seconds=61)) == -1.0
    failed = _status("Failed", Complete=("False", "InProgress", T0), Failed=("True", "DeadlineExceeded", T0))
    assert ttl_left(0, failed, T0) == 0.0
    assert ttl_left(60, _status("Running", Complete=("False", "InProgress", T0)), T0) is None
    assert ttl_left(None, done, T0 + timedelta(days=9)) is None


def test_the_next_look_is_the_soonest_wait_and_never_in_the_past() -> None:
    assert sooner(None, 30.0, 2.0, None) == 2.0
    assert sooner(-5.0, 30.0) == 0.0
    assert sooner(None, None) is None


def test_the_active_deadline_waits_while_the_pods_wait_for_kueue_and_counts_from_their_admission() -> None:
    queued = _status(Suspended=("False", "NotSuspended", T0), Queued=("True", "SchedulingGated", T0))
    held = deadline(600, False, queued, T0 + timedelta(days=1))
    assert (held.exceeded, held.wait_s) == (None, None)  # the clock is stopped: nothing to wake up for
    admitted = _status(Suspended=("False", "NotSuspended", T0),
                       Queued=("False", "Admitted", T0 + timedelta(hours=2)))
    assert deadline(600, False, admitted, T0 + timedelta(hours=2, seconds=599)).wait_s == 1.0
    over = deadline(600, False, admitted, T0 + timedelta(hours=2, seconds=600)).exceeded
    assert over is not None and over.startswith("running since 2026-11-26T12:00:00Z")
    resumed_later = _status(Suspended=("False", "NotSuspended", T0 + timedelta(hours=3)),
                            Queued=("False", "Admitted", T0))  # admitted long ago, resumed since: from the resume
    assert deadline(600, False, resumed_later, T0 + timedelta(hours=3, seconds=100)).wait_s == 500.0
