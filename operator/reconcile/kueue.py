"""Whether Kueue really queues a job that names a LocalQueue, from its pods. Pure.

The job's pods join Kueue as one plain-pod group (docs/operations.md, "Kueue"). Kueue's pod webhook
(kubernetes-sigs/kueue, pkg/controller/jobs/pod/pod_webhook.go, `Default`) labels every pod it manages
`kueue.x-k8s.io/managed=true` and gates it with `kueue.x-k8s.io/admission` at creation; it skips a pod,
and says nothing, when its `pod` framework is off, when managedJobsNamespaceSelector does not select the
pod's namespace, or when an enabled framework manages the pod's owner (`statefulset`: these pods belong to
StatefulSets). A skipped pod runs at once, outside the queue's quota: the job says so (Degraded).

When Kueue evicts the group (preemption, a stopped queue, PodsReady timeout) its pod controller sets a
`TerminationTarget` condition on each pod and deletes it (pod_controller.go, `Stop`; reason
`WorkloadEvictedDueTo<Evicted reason>`, e.g. `WorkloadEvictedDueToPreempted`, or `StoppedByKueue` in
older releases): the platform took the pod away, a preemption (pods.py), never a crash.

While every pod of the job waits behind a scheduling gate the job is Queued; the Queued condition's
lastTransitionTime when it turns False is when Kueue admitted it, which starts the active deadline
(lifecycle.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from rhymerl.api.spec import KUEUE_QUEUE_LABEL

MANAGED_LABEL = "kueue.x-k8s.io/managed"  # pkg/constants: ManagedByKueueLabelKey, value "true"
ADMISSION_GATE = "kueue.x-k8s.io/admission"  # pkg/controller/jobs/pod/constants: SchedulingGateName
TERMINATION_TARGET = "TerminationTarget"  # pod_controller.go: ConditionTypeTerminationTarget
MAX_LISTED = 3

Status = Literal["True", "False", "Unknown"]
Part = tuple[Status, str, str]


class Pod(Protocol):
    """What these decisions read of a pod (pods.PodView)."""

    @property
    def name(self) -> str: ...
    @property
    def deleting(self) -> bool: ...
    @property
    def gated(self) -> tuple[str, ...]: ...
    @property
    def kueue_bypassed(self) -> str | None: ...


def bypassed(pod: Mapping[str, Any]) -> str | None:
    """The LocalQueue a pod names when Kueue's webhook skipped it (neither its label nor its gate), else None."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    queue = labels.get(KUEUE_QUEUE_LABEL)
    if not queue or labels.get(MANAGED_LABEL) == "true":
        return None
    gates = {g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []}
    return None if ADMISSION_GATE in gates else str(queue)


def stopped(pod: Mapping[str, Any]) -> str | None:
    """Why Kueue stopped this pod (its TerminationTarget condition), else None."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == TERMINATION_TARGET and c.get("status") == "True":
            reason = str(c.get("reason") or TERMINATION_TARGET)
            return f"{reason}: {c['message']}" if c.get("message") else reason
    return None


def degraded(pods: Sequence[Pod], found: Part) -> Part:
    """`found` (the Degraded condition from everything else) unless it is no fault and Kueue skipped pods
    of a queued job: then that, naming the pods, the queue, the three causes and the fix."""
    skipped = sorted((p.name, p.kueue_bypassed) for p in pods if p.kueue_bypassed and not p.deleting)
    if found[0] == "True" or not skipped:
        return found
    names = [n for n, _ in skipped]
    more = f"; and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    which = f"{len(names)} pods ({'; '.join(names[:MAX_LISTED])}{more}) name" if len(names) > 1 else \
        f"pod {names[0]} names"
    return ("True", "KueueBypassed", f"{which} LocalQueue {skipped[0][1]} ({KUEUE_QUEUE_LABEL}) but Kueue did not "
            f"take them: no {MANAGED_LABEL}=true label, no {ADMISSION_GATE} scheduling gate, so the job runs outside "
            "the queue's quota. Kueue's pod webhook skips pods when its `pod` framework is not enabled "
            "(integrations.frameworks), when managedJobsNamespaceSelector does not select this namespace, or when "
            "its `statefulset` framework is enabled (these pods belong to StatefulSets); or Kueue is not installed. "
            "Fix Kueue's configuration, then suspend and resume the job so that its pods are created again")


def queued(pods: Sequence[Pod]) -> Part:
    """True while every live pod of the job waits behind a scheduling gate (Kueue has not admitted its pod
    group); a gated replacement beside running pods (Kueue ungates it in an admitted group) is not that."""
    live = [p for p in pods if not p.deleting]
    if live and all(p.gated for p in live):
        gates = sorted({g for p in live for g in p.gated})
        return ("True", "SchedulingGated", f"{len(live)} pods wait for their scheduling gates ({', '.join(gates)}): "
                "Kueue admits the job's pod group whole, once it fits its queue; spec.activeDeadlineSeconds does not "
                "run meanwhile")
    return ("False", "Admitted", "no pod waits for Kueue's admission; spec.activeDeadlineSeconds counts from this "
            "condition's lastTransitionTime, or from the last resume if later")
