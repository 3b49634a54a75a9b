"""What a job's pods say: ready, crashed, preempted, unschedulable; and the failure count. Pure.

Crashes are container restarts (the kubelet restarts a crashed container in place and counts it in
restartCount); they count against spec.failure_policy.backoff_limit. A restart whose container
last ended cleanly (exit 0: a controller that stopped on SIGTERM after checkpointing; or the rejoin
code, REJOIN_EXIT_CODE: a pod asking to join its job's next Ray head) is not a crash: counted apart,
as restarts. The kubelet keeps only the last termination, so restarts seen together are classed by
it. A pod taken away by the
platform (spot preemption, eviction, node shutdown or loss: the DisruptionTarget condition, or the
pod's reason, or a pod that goes away from a node tainted as going: nodes.py) is a preemption: the
StatefulSet replaces it and it never counts as a crash, nor does a restart of its containers seen with it
(a container killed with its node). Which pods
are already counted is kept in status.failures.counted, so an operator restart counts nothing twice.
A pod the kubelet evicted for using more local storage than its own limits allow is a crash, once:
its replacement would meet the same limit.

A disruption is counted on the pod that had it, once: a train pod evicted is a preemption of that pod,
a train container OOM-killed a crash of that pod, and the controller's own restart after it (exit
MEMBER_LOST_EXIT_CODE: its run lost a member) is neither. Such restarts with no member pod preempted or
crashing since (status.failures.unexplainedMemberLoss) count as crashes past MEMBER_LOST_LIMIT in a
row, so a controller that keeps losing a member nothing explains still meets the backoff limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rhymerl.api.roles import CLEAN_EXIT_CODES, MEMBER_LOST_EXIT_CODE
from rhymerl.api.status import CountedPod, Failures
from rhymerl.operator.manifests.labels import COMPONENT_KEY
from rhymerl.operator.reconcile.kueue import bypassed, stopped

Pod = Mapping[str, Any]

# Pod reasons of the platform taking a pod away (status.reason, or the DisruptionTarget condition's).
PREEMPTION_REASONS = frozenset({
    "PreemptionByScheduler", "PreemptionByKubeScheduler", "Preempting", "Preempted", "DeletionByTaintManager",
    "EvictionByEvictionAPI", "DeletionByPodGC", "TerminationByKubelet", "Evicted", "NodeLost", "NodeShutdown",
    "Shutdown", "Terminated", "NodeAffinity",
})
IMAGE_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
CONFIG_REASONS = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
CRASH_REASONS = frozenset({"CrashLoopBackOff"})
MAX_GONE = 32  # counted pods kept after they went away
# The kubelet's evictions of a pod over its own limits (pkg/kubelet/eviction/helpers.go:
# podEphemeralStorageMessageFmt, containerEphemeralStorageMessageFmt, emptyDirMessageFmt): the job's
# sizing, so a crash, never a preemption (which would evict its replacement again, forever).
OWN_LIMIT_EVICTIONS = ("exceeds the total limit of containers", "exceeded its local ephemeral storage limit",
                       "Usage of EmptyDir volume")
MEMBER_LOST_LIMIT = 3  # controller exits after a member was lost, in a row with no cause seen, that are not crashes
NOT_CRASHES = frozenset({*CLEAN_EXIT_CODES, MEMBER_LOST_EXIT_CODE})


@dataclass(frozen=True)
class PodView:
    """The facts about one pod the operator acts on."""

    name: str
    uid: str
    role: str
    ready: bool
    deleting: bool
    restarts: int
    preempted: str | None  # why, when the platform took it away
    unschedulable: str | None  # the scheduler's message
    waiting: str | None  # "container X: ImagePullBackOff: message" for image and config problems
    crash: str | None  # "container X exited 1 (Error)" for the last non-zero exit, if any
    crash_looping: bool
    evicted: str | None = None  # the kubelet's message, when it evicted the pod over its own limits
    clean_restart: bool = False  # every restarted container last ended cleanly (CLEAN_EXIT_CODES)
    gated: tuple[str, ...] = ()  # scheduling gates holding it (Kueue's, until it admits the job's pod group)
    kueue_bypassed: str | None = None  # the LocalQueue it names, when Kueue's webhook skipped it (kueue.py)
    member_lost: bool = False  # restarted after its run lost a member (MEMBER_LOST_EXIT_CODE), else cleanly


def _conditions(pod: Pod) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in pod.get("status", {}).get("conditions") or []}


def _containers(pod: Pod) -> list[Mapping[str, Any]]:
    status = pod.get("status", {})
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def over_limit(pod: Pod) -> str | None:
    """The kubelet's message when it evicted this pod for using more local storage than its own limits
    allow (OWN_LIMIT_EVICTIONS), else None."""
    messages = [pod.get("status", {}).get("message"), _conditions(pod).get("DisruptionTarget", {}).get("message")]
    return next((m.strip() for m in messages if isinstance(m, str) and any(p in m for p in OWN_LIMIT_EVICTIONS)),
                None)


def preemption(pod: Pod) -> str | None:
    """Why the platform took this pod away (spot preemption, eviction, node shutdown or loss), or None
    (also for an eviction over the pod's own limits: over_limit)."""
    if over_limit(pod):
        return None
    disruption = _conditions(pod).get("DisruptionTarget")
    if disruption is not None and disruption.get("status") == "True":
        reason = disruption.get("reason") or "DisruptionTarget"
        message = disruption.get("message")
        return f"{reason}: {message}" if message else reason
    reason = pod.get("status", {}).get("reason")
    if reason in PREEMPTION_REASONS or (isinstance(reason, str) and reason.startswith("Preempt")):
        message = pod.get("status", {}).get("message")
        return f"{reason}: {message}" if message else str(reason)
    return stopped(pod)  # Kueue evicted the job's pod group


def _exit(terminated: Mapping[str, Any]) -> str:
    code = terminated.get("exitCode")
    reason = terminated.get("reason")
    return f"exited {code}" + (f" ({reason})" if reason else "")


def node_name(pod: Pod) -> str:
    """The node the pod was placed on ("" while it waits for one)."""
    return str((pod.get("spec") or {}).get("nodeName") or "")


def view(pod: Pod, node: str | None = None, gone: bool = False) -> PodView:
    """`node`: why the pod's node is being taken away (nodes.disruption), if it is; `gone`: the pod was seen
    deleted. A pod going away (deleted, or being deleted) from such a node counts as preempted."""
    meta = pod.get("metadata", {})
    conditions = _conditions(pod)
    ready = conditions.get("Ready", {}).get("status") == "True"
    scheduled = conditions.get("PodScheduled", {})
    unschedulable = None
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        unschedulable = scheduled.get("message") or "no node fits the pod"
    restarts = 0
    waiting = crash = None
    looping = False
    clean = True
    lost = False
    for c in _containers(pod):
        name = c.get("name", "?")
        restarts += int(c.get("restartCount") or 0)
        last = (c.get("lastState") or {}).get("terminated") or {}
        if int(c.get("restartCount") or 0) and last.get("exitCode") not in CLEAN_EXIT_CODES:
            lost = lost or last.get("exitCode") == MEMBER_LOST_EXIT_CODE
            clean = clean and last.get("exitCode") == MEMBER_LOST_EXIT_CODE
        state = c.get("state") or {}
        wait = state.get("waiting") or {}
        reason = wait.get("reason")
        if reason in IMAGE_REASONS or reason in CONFIG_REASONS:
            detail = f": {wait['message']}" if wait.get("message") else ""
            waiting = waiting or f"container {name}: {reason}{detail}"
        looping = looping or reason in CRASH_REASONS
        for terminated in ((state.get("terminated") or {}), last):
            if terminated and terminated.get("exitCode") not in (None, *NOT_CRASHES) and crash is None:
                crash = f"container {name} {_exit(terminated)}"
    return PodView(
        name=meta.get("name", ""), uid=meta.get("uid", ""), role=(meta.get("labels") or {}).get(COMPONENT_KEY, ""),
        ready=ready and not meta.get("deletionTimestamp"), deleting=bool(meta.get("deletionTimestamp")),
        restarts=restarts, preempted=preemption(pod) or (node if gone or meta.get("deletionTimestamp") else None),
        unschedulable=unschedulable, waiting=waiting, crash=crash,
        crash_looping=looping and crash is not None, clean_restart=bool(restarts) and clean and not lost,
        member_lost=bool(restarts) and clean and lost,
        gated=tuple(str(g.get("name", "")) for g in (pod.get("spec") or {}).get("schedulingGates") or []),
        kueue_bypassed=bypassed(pod), evicted=over_limit(pod),
    )


@dataclass(frozen=True)
class FailureNote:
    """One newly counted failure, for a Kubernetes Event."""

    kind: str  # "crash", "restart" (not a crash) or "preemption"
    pod: str
    message: str


@dataclass(frozen=True)
class Count:
    failures: Failures
    notes: tuple[FailureNote, ...] = field(default=())


class _Tally:
    """The counters of one count() pass, and its notes."""

    def __init__(self, previous: Failures) -> None:
        self.crashes, self.preemptions, self.restarts = previous.crashes, previous.preemptions, previous.restarts
        self.unexplained, self.last = previous.unexplainedMemberLoss, previous.lastFailure
        self.notes: list[FailureNote] = []

    def restarted(self, pod: PodView, new: int) -> None:
        """`new` container restarts of `pod`, classed by how they ended."""
        if pod.clean_restart or pod.preempted:
            self.restarts += new
            why = "while the platform took the pod away" if pod.preempted else "after a clean exit"
            self.notes.append(FailureNote("restart", pod.name, f"pod {pod.name}: container restarted {why} (not a "
                                          "crash)"))
        elif pod.member_lost:
            for _ in range(new):
                self._member_lost(pod)
        else:
            self.crash(pod.name, f"pod {pod.name}: {pod.crash or 'container restarted'}", new)

    def crash(self, pod: str, last: str, new: int = 1) -> None:
        self.crashes += new
        self.last = last
        self.notes.append(FailureNote("crash", pod, f"{last} (crash {self.crashes})"))

    def _member_lost(self, pod: PodView) -> None:
        self.unexplained += 1
        if self.unexplained > MEMBER_LOST_LIMIT:
            self.crash(pod.name, f"pod {pod.name}: exited {MEMBER_LOST_EXIT_CODE} (its run lost a member) "
                                 f"{self.unexplained} times in a row with no member pod preempted or crashing")
            return
        self.restarts += 1
        self.notes.append(FailureNote("restart", pod.name, f"pod {pod.name}: restarted after its run lost a member "
                                      f"(exit {MEMBER_LOST_EXIT_CODE}): the member's pod counts the cause (not a "
                                      "crash)"))

    def preempted(self, pod: PodView) -> None:
        self.preemptions += 1
        self.last = f"pod {pod.name}: preempted ({pod.preempted})"
        self.notes.append(FailureNote("preemption", pod.name, f"{self.last}; the StatefulSet replaces it (not a "
                                      "crash)"))


def count(previous: Failures, pods: Sequence[PodView], gone: Iterable[PodView] = ()) -> Count:
    """Fold the pods seen now (and `gone`: pods seen deleted since the last pass) into the failure count.

    A pod's restarts are counted from what was already counted for the same pod uid (a replaced pod,
    same name and new uid, starts from zero); a preempted pod counts once. A member pod (not the
    controller) newly preempted or crashing explains the controller's member-lost restarts: the run of
    unexplained ones starts again. `counted` keeps the pods that exist and have something counted,
    plus the last MAX_GONE ones that went away (a deleted pod may be reported again by a late watch
    event), so it stays about as small as the job."""
    known = {c.uid: c for c in previous.counted}
    tally = _Tally(previous)
    current = {p.uid for p in pods}
    kept: list[CountedPod] = []
    went: list[CountedPod] = []
    seen: set[str] = set()
    ordered = sorted([*pods, *(g for g in gone if g.uid not in current)], key=lambda p: p.role == "controller")
    for pod in ordered:
        if pod.uid in seen or not pod.uid:
            continue
        seen.add(pod.uid)
        before = known.get(pod.uid, CountedPod(pod=pod.name, uid=pod.uid))
        new_restarts = max(0, pod.restarts - before.restarts)
        crashes = tally.crashes
        if new_restarts:
            tally.restarted(pod, new_restarts)
        preempted = before.preempted
        if pod.preempted and not preempted:
            preempted = True
            tally.preempted(pod)
        if pod.evicted and not before.evicted:
            tally.crash(pod.name, f"pod {pod.name}: evicted over its own limits ({pod.evicted})")
        if pod.role != "controller" and (preempted != before.preempted or tally.crashes > crashes):
            tally.unexplained = 0
        entry = CountedPod(pod=pod.name, uid=pod.uid, restarts=max(pod.restarts, before.restarts), preempted=preempted,
                           evicted=before.evicted or pod.evicted is not None)
        if entry.restarts or entry.preempted or entry.evicted:
            (kept if pod.uid in current else went).append(entry)
    went = [c for c in previous.counted if c.uid not in seen] + went
    kept.sort(key=lambda c: (c.pod, c.uid))
    counted = kept + went[-MAX_GONE:]
    return Count(Failures(crashes=tally.crashes, preemptions=tally.preemptions, restarts=tally.restarts,
                          unexplainedMemberLoss=tally.unexplained, lastFailure=tally.last, counted=counted),
                 tuple(tally.notes))
