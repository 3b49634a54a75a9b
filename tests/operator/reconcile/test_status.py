"""Pods -> facts and failure counts (reconcile.pods), facts -> conditions and phase (reconcile.conditions),
with hand-computed expectations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rhymerl.api.status import CountedPod, Failures
from rhymerl.operator.reconcile.conditions import (
    Observation,
    conditions,
    phase,
    status,
    transitions,
    with_times,
)
from rhymerl.operator.reconcile.lifecycle import Suspension
from rhymerl.operator.reconcile.pods import MAX_GONE, PodView, count, view

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"


def pod(name: str, uid: str = "", role: str = "rollout", ready: bool = True, restarts: int = 0,
        **status: Any) -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": str(ready)}]
    return {"metadata": {"name": name, "uid": uid or f"uid-{name}", "labels": {"app.kubernetes.io/component": role}},
            "status": {"phase": "Running", "conditions": conditions,
                       "containerStatuses": [{"name": role, "restartCount": restarts, "ready": ready}], **status}}


def pv(name: str, role: str = "rollout", ready: bool = True, **kw: Any) -> PodView:
    fields: dict[str, Any] = {"uid": f"uid-{name}", "deleting": False, "restarts": 0, "preempted": None,
                              "unschedulable": None, "waiting": None, "crash": None, "crash_looping": False}
    fields.update(kw)
    return PodView(name=name, role=role, ready=ready, **fields)


def healthy(rollout: int = 2) -> list[PodView]:
    return [pv("j-controller-0", "controller"), pv("j-train-0", "train"), pv("j-history-0", "history"),
            *(pv(f"j-rollout-{i}") for i in range(rollout))]


def obs(pods: list[PodView], **kw: Any) -> Observation:
    fields: dict[str, Any] = {"generation": 3, "suspend": False, "backoff_limit": 3,
                              "desired": {"controller": 1, "rollout": 2, "train": 1, "reward": 0, "history": 1},
                              "pods": pods, "failures": Failures(), "finished": False}
    fields.update(kw)
    return Observation(**fields)


def by_type(o: Observation) -> dict[str, tuple[str, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in conditions(o)}


# pods


def test_a_crash_looping_container_is_described_by_its_last_exit() -> None:
    raw = pod("p", ready=False, restarts=3)
    raw["status"]["containerStatuses"][0].update(state={"waiting": {"reason": "CrashLoopBackOff"}},
                                                 lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    v = view(raw)
    assert (v.restarts, v.crash, v.crash_looping, v.ready) == (3, "container rollout exited 137 (OOMKilled)", True,
                                                                False)


def test_an_unschedulable_pod_carries_the_schedulers_message() -> None:
    raw = {"metadata": {"name": "p", "uid": "u"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes: quota"}]}}
    assert view(raw).unschedulable == "0/3 nodes: quota"


def test_preemption_is_read_from_the_disruption_target_condition_or_the_pods_reason() -> None:
    disrupted = pod("a")
    disrupted["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                              "reason": "PreemptionByScheduler", "message": "for a critical pod"})
    shut_down = pod("b", phase="Failed", reason="Terminated", message="node shutdown")
    assert view(disrupted).preempted == "PreemptionByScheduler: for a critical pod"
    assert view(shut_down).preempted == "Terminated: node shutdown"
    assert view(pod("c")).preempted is None
    assert view(pod("d", phase="Failed", reason="Error")).preempted is None


def test_an_image_that_cannot_be_pulled_is_reported_with_its_container() -> None:
    raw = pod("p", ready=False)
    raw["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ImagePullBackOff", "message": "no such"}}
    assert view(raw).waiting == "container rollout: ImagePullBackOff: no such"


def test_restarts_count_once_per_pod_incarnation() -> None:
    before = Failures(crashes=1, counted=[CountedPod(pod="p", uid="u1", restarts=1)])
    first = count(before, [pv("p", uid="u1", restarts=3, crash="container c exited 1 (Error)")])
    assert (first.failures.crashes, first.failures.lastFailure) == (3, "pod p: container c exited 1 (Error)")
    assert [n.kind for n in first.notes] == ["crash"]
    again = count(first.failures, [pv("p", uid="u1", restarts=3)])
    assert again.failures == first.failures and again.notes == ()
    replaced = count(first.failures, [pv("p", uid="u2", restarts=1)])
    assert replaced.failures.crashes == 4
    assert replaced.failures.counted[0] == CountedPod(pod="p", uid="u2", restarts=1)


def test_a_preempted_pod_counts_once_even_when_seen_listed_and_then_deleted() -> None:
    victim = pv("p", uid="u1", preempted="PreemptionByScheduler", deleting=True)
    listed = count(Failures(), [victim])
    assert (listed.failures.preemptions, listed.failures.crashes) == (1, 0)
    gone = count(listed.failures, [pv("p", uid="u2")], gone=[victim])
    assert gone.failures.preemptions == 1 and gone.notes == ()
    late = count(gone.failures, [pv("p", uid="u2")], gone=[victim])  # a late watch event
    assert late.failures.preemptions == 1


def test_the_counted_list_forgets_all_but_the_last_pods_that_went_away() -> None:
    failures = Failures()
    for i in range(MAX_GONE + 5):
        failures = count(failures, [], gone=[pv(f"p{i}", uid=f"u{i}", preempted="Evicted")]).failures
    assert failures.preemptions == MAX_GONE + 5
    assert len(failures.counted) == MAX_GONE and failures.counted[-1].uid == f"u{MAX_GONE + 4}"


# conditions


def test_a_job_with_every_pod_ready_is_ready_and_running() -> None:
    o = obs(healthy())
    got = by_type(o)
    assert got["Ready"] == ("True", "AllRolesReady", "pods ready: controller 1/1, rollout 2/2, train 1/1, history 1/1")
    assert got["RolloutReady"] == ("True", "AllReplicasReady", "2/2 rollout pods ready")
    assert got["Degraded"][:2] == ("False", "AsExpected")
    assert got["Failed"] == ("False", "WithinBackoffLimit", "0 crashes counted, backoff_limit 3; 0 preemptions "
                                                            "(not counted)")
    assert phase(o, conditions(o)) == "Running"
    assert {c.observedGeneration for c in conditions(o)} == {3}


def test_a_job_short_of_rollout_pods_still_runs_but_is_not_ready() -> None:
    o = obs(healthy(rollout=1))
    got = by_type(o)
    assert got["Ready"] == ("False", "RolesNotReady", "pods ready: rollout 1/2")
    assert got["RolloutReady"] == ("False", "ReplicasNotReady", "1/2 rollout pods ready")
    assert phase(o, conditions(o)) == "Running"
    assert phase(obs(healthy(rollout=0)), conditions(obs(healthy(rollout=0)))) == "Pending"


def test_an_unschedulable_pod_outranks_a_crash_loop_in_degraded() -> None:
    pods = [*healthy(1), pv("j-rollout-1", ready=False, unschedulable="0/3 nodes: no GPU"),
            pv("j-train-1", "train", ready=False, crash="container train exited 1", crash_looping=True)]
    assert by_type(obs(pods))["Degraded"] == ("True", "Unschedulable", "pod j-rollout-1: 0/3 nodes: no GPU")
    looping = [*healthy(1), pv("j-rollout-1", ready=False, crash="container rollout exited 1", crash_looping=True)]
    assert by_type(obs(looping, failures=Failures(crashes=2)))["Degraded"] == (
        "True", "CrashLoop", "pod j-rollout-1: container rollout exited 1 (2 crashes counted, backoff_limit 3)")


def test_suspend_says_which_step_of_the_protocol_it_is_in_and_when_the_wait_ran_out() -> None:
    zero = dict.fromkeys(("controller", "rollout", "train", "reward", "history"), 0)
    deadline = datetime(2026, 11, 26, 10, 16, tzinfo=UTC)
    waiting = obs(healthy(1), suspend=True, desired={**zero, "rollout": 1, "train": 1, "history": 1},
                  suspension=Suspension("checkpoint", deadline, False, 900, 60.0))
    assert by_type(waiting)["Suspended"] == (
        "True", "CheckpointPending", "the controller pod finishes its step and checkpoints it (SIGTERM); the other "
        "roles are scaled to zero once it is gone, or at 2026-11-26T10:16:00Z (its grace period "
        "controller.termination_grace_seconds 900 s plus 60 s) at the latest")
    stopping = obs(healthy(1)[1:], suspend=True, desired=zero, suspension=Suspension("stopping", deadline, False, 900))
    status_, reason, message = by_type(stopping)["Suspended"]
    assert (status_, reason) == ("True", "ScalingDown")
    assert message == ("the controller pod stopped after its checkpoint; waiting for 3 pods to stop (j-history-0; "
                       "j-rollout-0; j-train-0)")
    late = obs(healthy(1), suspend=True, desired=zero, suspension=Suspension("stopping", deadline, True, 900))
    assert by_type(late)["Suspended"][1] == "CheckpointTimedOut"
    assert by_type(late)["Suspended"][2].startswith("the controller pod was not gone by 2026-11-26T10:16:00Z: every "
                                                    "role was scaled to zero without waiting for its checkpoint; "
                                                    "waiting for 4 pods to stop")
    done = obs([], suspend=True, desired=zero, suspension=Suspension("stopping", deadline, False, 900))
    assert by_type(done)["Suspended"][:2] == ("True", "Suspended")
    assert by_type(done)["Ready"][:2] == ("False", "Suspended")
    assert phase(done, conditions(done)) == "Suspended"
    assert phase(waiting, conditions(waiting)) == "Suspended"


def test_a_passed_active_deadline_fails_the_job_after_the_backoff_limit_in_precedence() -> None:
    o = obs(healthy(), deadline_exceeded="running since T, longer than spec.activeDeadlineSeconds 60")
    assert by_type(o)["Failed"][:2] == ("True", "DeadlineExceeded") and phase(o, conditions(o)) == "Failed"
    both = obs(healthy(), failures=Failures(crashes=4), deadline_exceeded="x")
    assert by_type(both)["Failed"][1] == "BackoffLimitExceeded"


def test_more_crashes_than_the_backoff_limit_fail_the_job_naming_the_last_one() -> None:
    failures = Failures(crashes=4, lastFailure="pod j-rollout-0: container rollout exited 1 (Error)")
    o = obs(healthy(), failures=failures)
    status_, reason, message = by_type(o)["Failed"]
    assert (status_, reason) == ("True", "BackoffLimitExceeded")
    assert message.startswith("4 crashes exceed spec.failurePolicy.backoffLimit 3; last: pod j-rollout-0: "
                              "container rollout exited 1 (Error)")
    assert phase(o, conditions(o)) == "Failed"
    assert by_type(obs(healthy(), failures=Failures(crashes=3)))["Failed"][0] == "False"  # 3 of 3 tolerated


def test_an_invalid_spec_fails_with_its_problems_as_the_message() -> None:
    o = obs([], invalid="spec.rollout.temperature: Input should be greater than or equal to 0")
    assert by_type(o)["Failed"] == ("True", "InvalidSpec", "spec.rollout.temperature: Input should be greater than "
                                                           "or equal to 0")
    assert by_type(o)["Ready"][:2] == ("False", "InvalidSpec")
    assert phase(o, conditions(o)) == "Failed"


def test_a_finished_job_succeeds() -> None:
    o = obs(healthy(), finished=True)
    assert by_type(o)["Complete"][:2] == ("True", "Finished")
    assert phase(o, conditions(o)) == "Succeeded"


def test_transition_times_move_only_when_the_status_flips() -> None:
    first = with_times(conditions(obs(healthy())), [], T0)
    previous = [c.model_dump() for c in first]
    same = with_times(conditions(obs(healthy(), generation=4)), previous, T1)
    assert {c.lastTransitionTime for c in same} == {T0}
    flipped = {c.type: c.lastTransitionTime for c in with_times(conditions(obs(healthy(1))), previous, T1)}
    assert (flipped["Ready"], flipped["RolloutReady"], flipped["TrainReady"]) == (T1, T1, T0)


def test_recomputing_an_unchanged_jobs_status_gives_the_same_object() -> None:
    o = obs(healthy(), failures=Failures(crashes=1, counted=[CountedPod(pod="p", uid="u", restarts=1)]))
    written = status(o, {}, T0)
    assert status(o, written, T1) == written
    assert written["roles"]["rollout"] == {"desired": 2, "ready": 2} and written["replicas"] == 2
    assert "progress" not in written


def test_events_announce_flips_and_new_reasons_and_a_new_job_only_what_is_true() -> None:
    start = conditions(obs(healthy()))
    assert {(e.type, e.reason) for e in transitions([], start)} == {("Normal", "AllRolesReady"),
                                                                     ("Normal", "AllReplicasReady")}
    previous = [c.model_dump() for c in start]
    broken = conditions(obs([*healthy(1), pv("j-rollout-1", ready=False, unschedulable="no GPU")]))
    events = {(e.type, e.reason) for e in transitions(previous, broken)}
    assert ("Warning", "Unschedulable") in events and ("Normal", "RolesNotReady") in events
    assert transitions(previous, start) == []


def test_a_child_the_api_server_refused_to_write_outranks_every_pod_problem() -> None:
    pods = [*healthy(1), pv("j-rollout-1", ready=False, unschedulable="0/3 nodes: no GPU")]
    o = obs(pods, refused=("StatefulSet/j-rollout: forbidden",))
    assert by_type(o)["Degraded"] == ("True", "ApplyFailed", "StatefulSet/j-rollout: forbidden")
