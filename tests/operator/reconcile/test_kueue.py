"""A queued job's pods against what Kueue's pod integration does to the pods it manages (kubernetes-sigs/kueue,
pkg/controller/jobs/pod): its webhook labels each one `kueue.x-k8s.io/managed=true` and gates it with
`kueue.x-k8s.io/admission` at creation; when it evicts the group it sets a `TerminationTarget` condition and
deletes the pods. A queued pod with neither the label nor the gate was skipped by Kueue (Degraded); a pod
Kueue stopped is a preemption, not a crash; while every pod waits behind a gate the job is Queued."""

from __future__ import annotations

from typing import Any

from rhymerl.api.spec import KUEUE_QUEUE_LABEL
from rhymerl.api.status import Failures
from rhymerl.operator.reconcile.conditions import Observation, conditions
from rhymerl.operator.reconcile.kueue import ADMISSION_GATE, MANAGED_LABEL
from rhymerl.operator.reconcile.pods import PodView, count, view


def _pod(name: str, queue: str | None = "team-a", managed: bool = True, gated: bool = False,
         **status: Any) -> dict[str, Any]:
    labels = {"app.kubernetes.io/component": "rollout"}
    if queue is not None:
        labels[KUEUE_QUEUE_LABEL] = queue
    if managed:
        labels[MANAGED_LABEL] = "true"
    spec = {"schedulingGates": [{"name": ADMISSION_GATE}]} if gated else {}
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels}, "spec": spec,
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "rollout", "restartCount": 0}], **status}}


def _by_type(pods: list[PodView]) -> dict[str, tuple[str, str, str]]:
    obs = Observation(generation=1, suspend=False, backoff_limit=3, desired={"rollout": len(pods)}, pods=pods,
                      failures=Failures(), finished=False)
    return {c.type: (c.status, c.reason, c.message) for c in conditions(obs)}


def test_a_queued_pod_kueue_neither_gated_nor_labelled_degrades_the_job_naming_the_three_causes() -> None:
    pods = [view(_pod("j-rollout-0", managed=False)), view(_pod("j-rollout-1", managed=False))]
    status, reason, message = _by_type(pods)["Degraded"]
    assert (status, reason) == ("True", "KueueBypassed")
    assert message.startswith("2 pods (j-rollout-0; j-rollout-1) name LocalQueue team-a")
    for cause in ("`pod` framework", "managedJobsNamespaceSelector", "`statefulset` framework"):
        assert cause in message
    assert "outside the queue's quota" in message


def test_pods_kueue_manages_or_that_name_no_queue_are_no_fault() -> None:
    managed = [view(_pod("a")), view(_pod("b", managed=False, gated=True)), view(_pod("c", queue=None, managed=False))]
    assert _by_type(managed)["Degraded"][:2] == ("False", "AsExpected")


def test_a_more_urgent_fault_is_said_first_and_a_bypass_after_it_is_fixed() -> None:
    raw = _pod("j-rollout-0", managed=False)
    raw["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ImagePullBackOff", "message": "nope"}}
    assert _by_type([view(raw)])["Degraded"][1] == "ContainerCannotStart"


def test_a_pod_kueue_stopped_counts_as_a_preemption_not_a_crash() -> None:
    stopped = _pod("j-rollout-0", conditions=[{"type": "TerminationTarget", "status": "True",
                                               "reason": "WorkloadEvictedDueToPreempted",
                                               "message": "Preempted to accommodate a higher priority Workload"}])
    stopped["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    stopped["status"]["containerStatuses"][0].update(restartCount=1, lastState={"terminated": {"exitCode": 143}})
    v = view(stopped)
    assert v.preempted == "WorkloadEvictedDueToPreempted: Preempted to accommodate a higher priority Workload"
    counted = count(Failures(), [v]).failures
    assert (counted.preemptions, counted.crashes) == (1, 0)
    older = _pod("p", conditions=[{"type": "TerminationTarget", "status": "True", "reason": "StoppedByKueue"}])
    assert view(older).preempted == "StoppedByKueue"  # older Kueue releases said this for every stop


def test_a_job_whose_pods_all_wait_behind_a_gate_is_queued_and_a_gated_replacement_does_not_queue_it_again() -> None:
    waiting = [view(_pod("a", gated=True)), view(_pod("b", gated=True))]
    assert _by_type(waiting)["Queued"][:2] == ("True", "SchedulingGated")
    replacing = [view(_pod("a")), view(_pod("b", gated=True))]  # Kueue ungates a replacement in an admitted group
    assert _by_type(replacing)["Queued"][:2] == ("False", "Admitted")
    assert _by_type([])["Queued"][0] == "False"
