"""The StatefulSet controller of the kube emulator (kube_emulator.Cluster), as kubernetes
pkg/controller/statefulset runs it for what the operator relies on: pods and their volume claims, failed
pods replaced, rolling updates one pod at a time, the status, a refused pod create recorded as a
FailedCreate event and tried again. Pod states are what the scheduler and the kubelet would report (Kueue's
label and scheduling gate, Unschedulable, Running and Ready)."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from rhymerl.operator.manifests.labels import COMPONENT_KEY, KUEUE_GROUP_LABEL

KUEUE_GATE = "kueue.x-k8s.io/admission"
KUEUE_MANAGED = "kueue.x-k8s.io/managed"  # the label Kueue's pod webhook puts on every pod it manages
REVISION = "controller-revision-hash"
LINGERING = "tests.rhymerl.io/lingering"  # holds a pod Terminating here (kmock removes one without finalizers at once)
NO_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Server(Protocol):
    def live(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]: ...

    def current(self, resource: Any, namespace: str | None, name: str | None) -> dict[str, Any] | None: ...


def revision(sts: Mapping[str, Any]) -> str:
    """The set's update revision, as the StatefulSet controller names it: `<set>-<hash of the template>`."""
    text = json.dumps(sts["spec"]["template"], sort_keys=True)
    return f"{sts['metadata']['name']}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def ready_status(containers: list[str]) -> dict[str, Any]:
    return {"phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": c, "ready": True, "restartCount": 0, "state": {"running": {"startedAt": now()}}}
                                  for c in containers]}


def gated_status() -> dict[str, Any]:
    return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                                                "message": "Scheduling is blocked due to non-empty scheduling gates"}]}


def unschedulable_status(message: str) -> dict[str, Any]:
    return {"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}


class StatefulSetController:
    """Cluster's StatefulSet controller; `step` calls `_statefulsets`."""

    server: _Server
    capacity: dict[str, int]
    lingering: set[str]
    admitted: set[str]
    kueue_webhook: bool  # Kueue's pod webhook acts on these pods (False: it skips them, as when misconfigured)

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = "application/merge-patch+json") -> Any:
        raise NotImplementedError

    async def attempt(self, method: str, path: str, body: Any = None,
                      content_type: str = "application/merge-patch+json") -> tuple[int, Any]:
        raise NotImplementedError

    @staticmethod
    def path(resource: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        raise NotImplementedError

    async def _statefulsets(self) -> int:
        """The StatefulSet controller (kubernetes pkg/controller/statefulset): pods `<set>-<ordinal>` up to
        replicas, each with its volume claims (`_claims`); a failed pod replaced; pods above replicas
        removed; with updateStrategy RollingUpdate, one pod at a time whose template revision is not the
        set's (the highest ordinal first, once the others are Ready: stateful_set_control.go,
        updateStatefulSet) deleted, to be created anew from the current template; the status."""
        done = 0
        for sts in self.server.live("statefulsets"):
            meta, spec = sts["metadata"], sts["spec"]
            namespace, name = meta["namespace"], meta["name"]
            pods = {p["metadata"]["name"]: p for p in self.server.live("pods", namespace)
                    if any(r.get("uid") == meta["uid"] for r in p["metadata"].get("ownerReferences") or [])}
            want = int(spec.get("replicas") or 0)
            for ordinal in range(want):
                done += await self._converge_pod(sts, ordinal, pods.get(f"{name}-{ordinal}"))
            for pod_name, pod in pods.items():
                if int(pod_name.rsplit("-", 1)[1]) >= want and not pod["metadata"].get("deletionTimestamp"):
                    if pod_name in self.lingering:  # SIGTERM sent; the pod is gone once the test says so
                        await self.request("PATCH", self.path("v1/pods", namespace, pod_name),
                                           {"metadata": {"deletionTimestamp": now(), "finalizers": [LINGERING]}})
                    else:
                        await self.request("DELETE", self.path("v1/pods", namespace, pod_name))
                    done += 1
            done += await self._roll(sts, [p for n, p in pods.items() if int(n.rsplit("-", 1)[1]) < want])
            live = [p for p in self.server.live("pods", namespace)
                    if any(r.get("uid") == meta["uid"] for r in p["metadata"].get("ownerReferences") or [])]
            status = {"replicas": len(live), "readyReplicas": sum(1 for p in live if ready(p)),
                      "observedGeneration": meta.get("generation", 1)}
            if {k: (sts.get("status") or {}).get(k) for k in status} != status:
                await self.request("PATCH", self.path("apps/v1/statefulsets", namespace, name, "status"),
                                   {"status": status})
                done += 1
        return done

    async def _converge_pod(self, sts: dict[str, Any], ordinal: int, pod: dict[str, Any] | None) -> int:
        meta, spec = sts["metadata"], sts["spec"]
        namespace, name = meta["namespace"], meta["name"]
        pod_name = f"{name}-{ordinal}"
        role = spec["template"]["metadata"]["labels"].get(COMPONENT_KEY, "")
        want = int(spec.get("replicas") or 0)
        fits = ordinal < self.capacity.get(role, want)
        containers = [c["name"] for c in spec["template"]["spec"]["containers"]]
        group = spec["template"]["metadata"]["labels"].get(KUEUE_GROUP_LABEL) if self.kueue_webhook else None
        gated = group is not None and group not in self.admitted
        if pod is None:
            if self.server.current("v1/pods", namespace, pod_name) is not None:
                return 0  # an earlier set's pod of this name, still terminating: AlreadyExists, tried again later
            status = gated_status() if gated else ready_status(containers) if fits else unschedulable_status(NO_GPU)
            volumes = [*spec["template"]["spec"].get("volumes", []), *await self._claims(sts, ordinal)]
            pod_spec = {**spec["template"]["spec"], "volumes": volumes,
                        **({"schedulingGates": [{"name": KUEUE_GATE}]} if gated else {})}
            labels = {**spec["template"]["metadata"]["labels"], "statefulset.kubernetes.io/pod-name": pod_name,
                      REVISION: revision(sts), **({KUEUE_MANAGED: "true"} if group is not None else {})}
            code, answer = await self.attempt("POST", self.path("v1/pods", namespace), {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "namespace": namespace, "labels": labels,
                             "annotations": dict(spec["template"]["metadata"].get("annotations") or {}),
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name,
                                                  "uid": meta["uid"], "controller": True}]},
                "spec": pod_spec, "status": status})
            if code >= 300:
                return await self._failed_create(sts, pod_name, str((answer or {}).get("message") or code))
            return 1
        if pod["status"].get("phase") == "Failed":
            await self.request("DELETE", self.path("v1/pods", namespace, pod_name))
            return 1
        if fits and pod["status"].get("phase") == "Pending" and not pod["spec"].get("schedulingGates"):
            await self.request("PATCH", self.path("v1/pods", namespace, pod_name, "status"),
                               {"status": ready_status(containers)})
            return 1
        return 0

    async def _failed_create(self, sts: dict[str, Any], pod_name: str, error: str) -> int:
        """A refused pod create, as stateful_pod_control.go (CreateStatefulPod, recordPodEvent) records it: a
        Warning event FailedCreate on the set, `create Pod <pod> in StatefulSet <set> failed error: <error>`;
        the controller tries again on a later round (its work queue's backoff). An event like the last one is
        not written again (the event recorder would only count it), so a refused pod settles the cluster."""
        meta = sts["metadata"]
        message = f"create Pod {pod_name} in StatefulSet {meta['name']} failed error: {error}"
        if any(e.get("reason") == "FailedCreate" and e.get("message") == message
               and e["involvedObject"].get("uid") == meta["uid"] for e in self.server.live("events", meta["namespace"])):
            return 0
        stamp = now()
        await self.request("POST", self.path("v1/events", meta["namespace"]), {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": "Warning", "reason": "FailedCreate", "message": message,
            "source": {"component": "statefulset-controller"}, "firstTimestamp": stamp, "lastTimestamp": stamp,
            "count": 1})
        return 1

    async def _claims(self, sts: dict[str, Any], ordinal: int) -> list[dict[str, Any]]:
        """The pod's volumes of the set's volumeClaimTemplates, creating each claim `<template>-<set>-<ordinal>`
        that does not exist and reusing one that does, whoever made it (stateful_set_utils.go,
        getPersistentVolumeClaimName; stateful_pod_control.go, createMissingPersistentVolumeClaims). With
        persistentVolumeClaimRetentionPolicy.whenDeleted Delete the set owns its claims, so they go with it;
        otherwise nothing owns them and they stay (updateClaimOwnerRefForSetAndPod)."""
        meta, spec = sts["metadata"], sts["spec"]
        namespace, name = meta["namespace"], meta["name"]
        policy = (spec.get("persistentVolumeClaimRetentionPolicy") or {}).get("whenDeleted", "Retain")
        owners = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name, "uid": meta["uid"],
                   "blockOwnerDeletion": True}] if policy == "Delete" else []
        volumes = []
        for template in spec.get("volumeClaimTemplates") or []:
            claim = f"{template['metadata']['name']}-{name}-{ordinal}"
            found = self.server.current("v1/persistentvolumeclaims", namespace, claim)
            if found is None:
                labels = {**(template["metadata"].get("labels") or {}), **spec["selector"].get("matchLabels", {})}
                await self.request("POST", self.path("v1/persistentvolumeclaims", namespace), {
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim, "namespace": namespace, "labels": labels, "ownerReferences": owners},
                    "spec": template["spec"], "status": {"phase": "Bound"}})
            elif owners and not any(r.get("uid") == meta["uid"] for r in found["metadata"].get("ownerReferences") or []):
                await self.request("PATCH", self.path("v1/persistentvolumeclaims", namespace, claim),
                                   {"metadata": {"ownerReferences": owners}})
            volumes.append({"name": template["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}})
        return volumes

    async def _roll(self, sts: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        if (sts["spec"].get("updateStrategy") or {}).get("type", "RollingUpdate") != "RollingUpdate":
            return 0
        current = revision(sts)
        stale = sorted((p for p in pods if p["metadata"]["labels"].get(REVISION) != current
                        and not p["metadata"].get("deletionTimestamp")),
                       key=lambda p: int(p["metadata"]["name"].rsplit("-", 1)[1]))
        others_ready = all(ready(p) for p in pods if stale and p is not stale[-1])
        if not stale or not others_ready:
            return 0
        meta = stale[-1]["metadata"]
        await self.request("DELETE", self.path("v1/pods", meta["namespace"], meta["name"]))
        return 1
