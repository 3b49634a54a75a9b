"""spec.rollout.autoscaling's decision (operator/reconcile/autoscale.py), by hand: the recommendation within
bounds, at most max_step pods per change, at most one change per cooldown, no scale-up while pods wait for a
node; and the rollout grace period the spot section asks for."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rhymerl.api.rollout import RolloutSpec
from rhymerl.api.spec import RLJob
from rhymerl.api.status import Failures
from rhymerl.cli.worker import wanted_rollout
from rhymerl.operator.manifests import Owner, desired
from rhymerl.operator.reconcile.autoscale import decide, with_rollout_replicas
from rhymerl.operator.reconcile.nodes import disruption
from rhymerl.operator.reconcile.pods import count, view

NOW = datetime(2026, 11, 26, 10, 0, 0, tzinfo=UTC)


def rollout(**auto: Any) -> RolloutSpec:
    return RolloutSpec(replicas=2, min_replicas=1, max_replicas=8,
                       autoscaling={"enabled": True, "cooldown_seconds": 300, "max_step": 2, **auto})


def status(recommended: int | None, replicas: int | None = None, last: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"progress": {"recommendedRolloutWorkers": recommended}}
    if replicas is not None:
        out["autoscaling"] = {"replicas": replicas, "lastScaleTime": last, "message": ""}
    return out


def test_autoscaling_off_decides_nothing() -> None:
    assert decide(RolloutSpec(replicas=2, max_replicas=4), status(4), 0, NOW) is None


def test_a_first_recommendation_moves_from_spec_replicas_by_at_most_max_step_at_once() -> None:
    decision = decide(rollout(), status(7), 0, NOW)
    assert decision is not None
    assert (decision.status.replicas, decision.status.lastScaleTime) == (4, "2026-11-26T10:00:00Z")  # 2 + max_step 2
    assert decision.status.message == "2 -> 4 rollout pods, 7 recommended, +3 more after the cooldown (max_step 2)"


def test_a_recommendation_outside_the_bounds_is_clamped_to_them() -> None:
    up = decide(rollout(max_step=100), status(50, 3, "2026-11-26T09:00:00Z"), 0, NOW)
    down = decide(rollout(max_step=100), status(0, 3, "2026-11-26T09:00:00Z"), 0, NOW)
    assert up is not None and down is not None
    assert (up.status.replicas, down.status.replicas) == (8, 1)
    assert up.status.message == "3 -> 8 rollout pods, 8 recommended (the controller recommends 50; bounds 1-8)"


def test_within_the_cooldown_the_count_holds_and_the_pass_looks_again_when_it_ends() -> None:
    last = "2026-11-26T09:58:00Z"  # 120 s ago; cooldown 300 s: 180 s left
    decision = decide(rollout(), status(6, 4, last), 0, NOW)
    assert decision is not None
    assert (decision.status.replicas, decision.status.lastScaleTime, decision.wait_s) == (4, last, 180.0)
    assert "cooldown until 2026-11-26T10:03:00Z" in decision.status.message
    after = decide(rollout(), status(6, 4, last), 0, datetime(2026, 11, 26, 10, 3, 0, tzinfo=UTC))
    assert after is not None and (after.status.replicas, after.status.lastScaleTime) == (6, "2026-11-26T10:03:00Z")


def test_a_scale_down_moves_by_max_step_too() -> None:
    decision = decide(rollout(), status(1, 8, "2026-11-26T09:00:00Z"), 0, NOW)
    assert decision is not None and decision.status.replicas == 6


def test_no_scale_up_while_rollout_pods_wait_for_a_node_but_a_scale_down_goes_ahead() -> None:
    held = decide(rollout(), status(8, 4, "2026-11-26T09:00:00Z"), 2, NOW)
    shrunk = decide(rollout(), status(3, 4, "2026-11-26T09:00:00Z"), 2, NOW)
    assert held is not None and shrunk is not None
    assert (held.status.replicas, held.status.lastScaleTime, held.wait_s) == (4, "2026-11-26T09:00:00Z", None)
    assert "holding while 2 rollout pods wait for a node (capacity is short)" in held.status.message
    assert shrunk.status.replicas == 3


def test_without_a_recommendation_the_count_stays_where_it_is() -> None:
    decision = decide(rollout(), status(None, 5, "2026-11-26T09:00:00Z"), 0, NOW)
    assert decision is not None and decision.status.replicas == 5
    first = decide(rollout(), {}, 0, NOW)
    assert first is not None and (first.status.replicas, first.status.lastScaleTime) == (2, "")


def test_the_count_goes_to_the_rollout_statefulset_unless_it_is_at_zero() -> None:
    job = RLJob.model_validate({"metadata": {"name": "alpha"}, "spec": {"rollout": {"max_replicas": 8}}})
    objects = desired(job, Owner("rhymerl.io/v1alpha1", "RLJob", "alpha", "u"))
    sized = {o["metadata"]["name"]: o["spec"]["replicas"] for o in with_rollout_replicas(objects, 5)
             if o["kind"] == "StatefulSet"}
    assert sized == {"alpha-controller": 1, "alpha-rollout": 5, "alpha-train": 1, "alpha-history": 1,
                     "alpha-reward": 0}
    suspended = job.model_copy(update={"spec": job.spec.model_copy(update={"suspend": True})})
    stopped = with_rollout_replicas(desired(suspended, None), 5)
    assert {o["spec"]["replicas"] for o in stopped if o["kind"] == "StatefulSet"} == {0}


def test_rollout_pods_get_the_spec_termination_grace_to_hand_their_samples_back() -> None:
    job = RLJob.model_validate({"metadata": {"name": "alpha"}, "spec": {"rollout": {"termination_grace_seconds": 120}}})
    sts = next(o for o in desired(job, None) if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "alpha-rollout")
    pod = sts["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120
    assert {"name": "RHYMERL_GRACE_S", "value": "120"} in pod["containers"][0]["env"]
    default = next(o for o in desired(RLJob(), None) if o["kind"] == "StatefulSet"
                   and o["metadata"]["name"] == "rljob-rollout")
    assert default["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 60


def test_a_container_restart_seen_on_a_pod_the_platform_takes_away_is_no_crash() -> None:
    pod = {"metadata": {"name": "alpha-rollout-1", "uid": "u1", "labels": {}, "deletionTimestamp": "x"},
           "status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                                      "message": "Pod was terminated in response to imminent node shutdown."}],
                      "containerStatuses": [{"name": "worker", "restartCount": 1,
                                             "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}}
    counted = count(Failures(), [view(pod)])
    assert (counted.failures.crashes, counted.failures.preemptions, counted.failures.restarts) == (0, 1, 1)


def test_the_taints_of_a_node_that_goes_are_told_from_those_of_a_node_that_stays() -> None:
    going = [("node.kubernetes.io/unreachable", "NoExecute"), ("node.kubernetes.io/not-ready", "NoExecute"),
             ("node.kubernetes.io/out-of-service", "NoExecute"), ("node.cloudprovider.kubernetes.io/shutdown", "NoSchedule"),
             ("cloud.google.com/impending-node-termination", "NoSchedule"),
             ("aws-node-termination-handler/spot-itn", "NoSchedule"), ("ToBeDeletedByClusterAutoscaler", "NoSchedule"),
             ("karpenter.sh/disrupted", "NoSchedule"), ("karpenter.sh/disruption", "NoSchedule")]
    for key, effect in going:
        assert disruption("n1", [{"key": key, "effect": effect}]) is not None, key
    staying = [("node.kubernetes.io/unreachable", "NoSchedule"),  # not ready for new pods, the running ones stay
               ("node.kubernetes.io/unschedulable", "NoSchedule"),  # a cordon
               ("kubernetes.azure.com/scalesetpriority", "NoSchedule"),  # a spot pool's own taint
               ("DeletionCandidateOfClusterAutoscaler", "PreferNoSchedule")]  # only a candidate
    for key, effect in staying:
        assert disruption("n1", [{"key": key, "effect": effect}]) is None, key
    assert disruption("n1", [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]) == (
        "NodeTaint: node lost (unreachable): node n1 has the taint node.kubernetes.io/unreachable:NoExecute")


def test_a_pod_that_goes_away_from_a_tainted_node_is_a_preemption_and_its_restart_no_crash() -> None:
    why = disruption("n1", [{"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}])
    pod = {"metadata": {"name": "alpha-rollout-1", "uid": "u1", "labels": {}}, "spec": {"nodeName": "n1"},
           "status": {"containerStatuses": [{"name": "worker", "restartCount": 1,
                                             "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}}
    assert view(pod, why).preempted is None  # still running there: the node may yet stay
    assert count(Failures(), [view(pod)]).failures.crashes == 1  # without the node's word: a crash
    deleting = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2026-11-26T10:00:00Z"}}
    counted = count(Failures(), [view(deleting, why)])
    assert (counted.failures.crashes, counted.failures.preemptions, counted.failures.restarts) == (0, 1, 1)
    assert counted.failures.lastFailure == f"pod alpha-rollout-1: preempted ({why})"
    gone = count(Failures(), [], [view(pod, why, gone=True)])  # seen only once deleted
    assert (gone.failures.crashes, gone.failures.preemptions) == (0, 1)


def test_the_controller_follows_spec_replicas_or_with_autoscaling_the_operators_count() -> None:
    job = RLJob.model_validate({"spec": {"rollout": {"replicas": 2, "max_replicas": 6}}})
    assert wanted_rollout({"spec": {"rollout": {"replicas": 9}}}, job, 2) == 6  # clamped as the operator does
    assert wanted_rollout({"spec": {"rollout": {"replicas": 3}}}, job, 2) == 3
    assert wanted_rollout({"spec": {}}, job, 4) == 4
    auto = {"rollout": {"replicas": 3, "autoscaling": {"enabled": True}}}
    assert wanted_rollout({"spec": auto}, job, 2) == 6  # every pod there is, until the operator decides
    assert wanted_rollout({"spec": auto, "status": {"autoscaling": {"replicas": 4}}}, job, 2) == 4
