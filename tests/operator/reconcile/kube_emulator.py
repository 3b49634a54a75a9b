"""A Kubernetes for the operator tests: kmock's in-process API server plus the cluster's own parts.

kmock stores objects and streams watch events, but it is no Kubernetes: no uid, resourceVersion or
generation, no server-side apply, no status and scale subresources, no garbage collector, no
StatefulSet controller, no scheduler, no kubelet, no validation, no label selectors; and it finds an
object by scanning every object it holds, on every request. `ApiServer` adds what the operator
relies on of the API server, and finds objects by key and lists one kind in one namespace (`_Objects`,
an index by kind), filtered by `labelSelector` (benchmarks/operator-scale runs 1,000 jobs on it); `Cluster.step` plays the garbage collector, the StatefulSet controller,
the scheduler and the kubelet, one round at a time, through the same HTTP API (so the operator sees
watch events). The operator under test is never part of this: it runs as in a cluster.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp
import aiohttp.web
import attrs
import kmock
from kmock._internal import dicts, enums, k8s_dicts, k8s_views, references, rendering

from rhymerl.operator.manifests.labels import (
    COMPONENT_KEY,
    INSTANCE_KEY,
    KUEUE_GROUP_LABEL,
    KUEUE_TOTAL_ANNOTATION,
)

ALL_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
RESOURCES: dict[str, tuple[str, set[str]]] = {
    "rhymerl.io/v1alpha1/rljobs": ("RLJob", {"status", "scale"}),
    "v1/configmaps": ("ConfigMap", set()),
    "v1/services": ("Service", set()),
    "v1/serviceaccounts": ("ServiceAccount", set()),
    "v1/pods": ("Pod", {"status"}),
    "v1/events": ("Event", set()),
    "v1/secrets": ("Secret", set()),
    "apps/v1/statefulsets": ("StatefulSet", {"status", "scale"}),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", {"status"}),
    "rbac.authorization.k8s.io/v1/roles": ("Role", set()),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", set()),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", set()),
}
FIXTURE_AGENT = "cluster-fixture"
KUEUE_GATE = "kueue.x-k8s.io/admission"
LINGERING = "tests.rhymerl.io/lingering"  # holds a pod Terminating here (kmock removes one without finalizers at once)
NO_GPU = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Objects(k8s_views.ObjectsArray):
    """kmock's store of objects, indexed by kind: kind -> (namespace, name) -> object."""

    def kind(self, resource: references.resource) -> dict[tuple[str | None, str], k8s_dicts.Object]:
        index: dict[references.resource, dict[tuple[str | None, str], k8s_dicts.Object]] = \
            self.__dict__.setdefault("index", {})
        return index.setdefault(resource, {})

    def __setitem__(self, key: Any, value: Any, /) -> None:
        super().__setitem__(key, value)
        if len(key) == 3:
            resource = k8s_views._parse_resource(key[0])
            self.kind(resource)[key[1], key[2]] = self._objects[resource, key[1], key[2]]

    def __delitem__(self, key: Any, /) -> None:
        super().__delitem__(key)
        if len(key) == 3:
            self.kind(k8s_views._parse_resource(key[0])).pop((key[1], key[2]), None)

    def clear(self) -> None:
        super().clear()
        self.__dict__.pop("index", None)


def selected(obj: Mapping[str, Any], selector: str | None) -> bool:
    """Whether `obj`'s labels match a label selector of `key=value` terms (what the operator sends)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return not selector or all(labels.get(k) == v for k, _, v in (term.partition("=") for term in selector.split(",")))


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with uid, creationTimestamp, resourceVersion (and 409 on a stale one), generation
    (bumped when the spec changes), server-side apply creating missing objects, and RLJob's status and
    scale subresources (status writes change only status; scale reads and writes spec.rollout.replicas)."""

    _versions = itertools.count(1)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_objects", _Objects())
        super().__attrs_post_init__()

    def _KubernetesEmulator__get_objs(self, request: rendering.Request, strict: bool) -> list[k8s_dicts.Object]:
        """What kmock finds by scanning every object: one by its key, or one kind (in one namespace)."""
        assert isinstance(self._objects, _Objects) and request.resource is not None
        if request.name is not None and (strict or request.namespace is not None):
            found = self._objects._objects.get((request.resource, request.namespace, request.name))
            return [] if found is None else [found]
        return [obj for (ns, name), obj in list(self._objects.kind(request.resource).items())
                if (request.namespace is None or ns == request.namespace)
                and (request.name is None or name == request.name)]

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        listed = await super()._serve_list(request)
        assert isinstance(listed, dict)
        selector = request.params.get("labelSelector")
        return {**listed, "items": [o for o in listed["items"] if selected(o, selector)]} if selector else listed

    def declare(self, namespaces: list[str]) -> None:
        for path, (kind, subresources) in RESOURCES.items():
            self.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=True, verbs=ALL_VERBS,
                                                      subresources=subresources)
        self.resources["v1/nodes"] = kmock.ResourceInfo(kind="Node", namespaced=False, verbs=ALL_VERBS)
        for namespace in namespaces:
            self.objects["v1/namespaces", None, namespace] = {"metadata": {"name": namespace}}

    def current(self, resource: Any, namespace: str | None, name: str | None) -> dict[str, Any] | None:
        obj = self._objects._objects.get((k8s_views._parse_resource(resource), namespace, name))
        return None if obj is None or obj.deleted else obj.raw

    def live(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        assert isinstance(self._objects, _Objects)
        index: dict[Any, dict[tuple[str | None, str], k8s_dicts.Object]] = self._objects.__dict__.get("index", {})
        return [obj.raw for resource, kind in list(index.items()) if resource.plural == plural
                for (ns, _), obj in list(kind.items()) if not obj.deleted and (namespace is None or ns == namespace)]

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource is None or resource.plural == "namespaces":
            return await super()._handle(request)
        if request.subresource == "scale" and resource.plural == "rljobs":
            return await self._scale(request)
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            self._stamp_new(request.data, request.namespace)
        elif request.action == enums.action.UPDATE and isinstance(request.data, dict):
            current = self.current(resource, request.namespace, request.name)
            if current is None:
                if "apply-patch" not in request.headers.get("Content-Type", ""):
                    raise kmock.KubernetesObjectNotFoundError()
                self._stamp_new(request.data, request.namespace)  # server-side apply creates
                request = self._swap(request, attrs.evolve(request, action=enums.action.CREATE,
                                                           method=enums.method.POST))
            else:
                self._stamp_update(request, current)
        return await super()._handle(request)

    def _swap(self, old: rendering.Request, new: rendering.Request) -> rendering.Request:
        """Serve `new` in place of `old` (kmock matches reactions to the requests it recorded, by identity)."""
        for i, recorded in enumerate(self._requests):
            if recorded is old:
                self._requests[i] = new
        return new

    def _stamp_new(self, data: dict[str, Any], namespace: str | None) -> None:
        meta = data.setdefault("metadata", {})
        meta.setdefault("namespace", namespace)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1,
                    resourceVersion=str(next(self._versions)))
        for key in ("deletionTimestamp", "managedFields"):
            meta.pop(key, None)

    def _stamp_update(self, request: rendering.Request, current: dict[str, Any]) -> None:
        data = request.data
        meta = data.get("metadata") or {}
        stale = meta.get("resourceVersion")
        if stale and stale != current["metadata"].get("resourceVersion"):
            raise kmock.KubernetesError(status=409, reason="Conflict", message=(
                f"Operation cannot be fulfilled on {request.resource}: the object has been modified; "
                "please apply your changes to the latest version and try again"))
        if request.resource is not None and request.resource.plural == "rljobs":
            if request.subresource == "status":
                kept = data.get("status")
                data.clear()
                data["status"] = kept
            else:
                data.pop("status", None)
        merged = dicts.patch_dict(copy.deepcopy(current), copy.deepcopy(data))
        meta = data.setdefault("metadata", {})
        if request.subresource is None and merged.get("spec") != current.get("spec"):
            meta["generation"] = int(current["metadata"].get("generation") or 1) + 1
        meta["resourceVersion"] = str(next(self._versions))

    async def _scale(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        job = self.current(request.resource, request.namespace, request.name)
        if job is None:
            raise kmock.KubernetesObjectNotFoundError()
        if request.method == enums.method.PATCH:
            replicas = request.data["spec"]["replicas"]
            inner = attrs.evolve(request, subresource=None, data={"spec": {"rollout": {"replicas": replicas}}})
            await self._handle(self._swap(request, inner))
            self._swap(inner, request)
            job = self.current(request.resource, request.namespace, request.name) or job
        return aiohttp.web.json_response({
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": job["metadata"]["name"], "namespace": job["metadata"]["namespace"]},
            "spec": {"replicas": job["spec"]["rollout"]["replicas"]},
            "status": {"replicas": (job.get("status") or {}).get("replicas", 0),
                       "selector": (job.get("status") or {}).get("selector", "")},
        })


def _ready_status(containers: list[str]) -> dict[str, Any]:
    return {"phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": c, "ready": True, "restartCount": 0, "state": {"running": {"startedAt": now()}}}
                                  for c in containers]}


def _gated_status() -> dict[str, Any]:
    return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                                                "message": "Scheduling is blocked due to non-empty scheduling gates"}]}


def _unschedulable_status(message: str) -> dict[str, Any]:
    return {"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}


class Cluster:
    """The cluster around the API server: call `step` to let the garbage collector, the StatefulSet
    controller, the scheduler and the kubelet act once; the helpers below stage what a test needs
    (a preemption, a crash). `capacity[role]`: pods of that role the nodes can hold (default: all)."""

    def __init__(self, server: ApiServer, http: aiohttp.ClientSession) -> None:
        self.server = server
        self.http = http
        self.capacity: dict[str, int] = {}
        self.lingering: set[str] = set()  # pods a scale-down leaves Terminating (in their grace period)
        self.admitted: set[str] = set()  # Kueue pod groups admitted (others' pods are created gated)

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/merge-patch+json"
                      ) -> Any:
        headers = {"Content-Type": content_type if method == "PATCH" else "application/json"}
        async with self.http.request(method, path, json=body, headers=headers) as response:
            data = await response.json(content_type=None)
            if response.status >= 300:
                raise AssertionError(f"{method} {path}: {response.status} {data}")
            return data

    # the cluster's controllers

    async def step(self) -> int:
        """One round of every controller; returns how many writes they made."""
        return await self._collect_garbage() + await self._statefulsets()

    async def _collect_garbage(self) -> int:
        uids = {o["metadata"].get("uid") for plural in {p.rsplit("/", 1)[1] for p in RESOURCES}
                for o in self.server.live(plural)}
        done = 0
        for path in RESOURCES:
            plural = path.rsplit("/", 1)[1]
            for obj in self.server.live(plural):
                owners = obj["metadata"].get("ownerReferences") or []
                if owners and not any(ref.get("uid") in uids for ref in owners):
                    await self.request("DELETE", self.path(path, obj["metadata"]["namespace"], obj["metadata"]["name"]))
                    done += 1
        return done

    @staticmethod
    def path(resource: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        group_version, plural = resource.rsplit("/", 1)
        root = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        return f"{root}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    async def _statefulsets(self) -> int:
        done = 0
        for sts in self.server.live("statefulsets"):
            meta, spec = sts["metadata"], sts["spec"]
            namespace, name = meta["namespace"], meta["name"]
            role = spec["template"]["metadata"]["labels"].get(COMPONENT_KEY, "")
            pods = {p["metadata"]["name"]: p for p in self.server.live("pods", namespace)
                    if any(r.get("uid") == meta["uid"] for r in p["metadata"].get("ownerReferences") or [])}
            want = int(spec.get("replicas") or 0)
            for ordinal in range(want):
                pod_name = f"{name}-{ordinal}"
                pod = pods.get(pod_name)
                fits = ordinal < self.capacity.get(role, want)
                containers = [c["name"] for c in spec["template"]["spec"]["containers"]]
                group = spec["template"]["metadata"]["labels"].get(KUEUE_GROUP_LABEL)
                gated = group is not None and group not in self.admitted
                if pod is None:
                    status = _gated_status() if gated else _ready_status(containers) if fits else \
                        _unschedulable_status(NO_GPU)
                    pod_spec = {**spec["template"]["spec"], **({"schedulingGates": [{"name": KUEUE_GATE}]} if gated else {})}
                    await self.request("POST", self.path("v1/pods", namespace), {
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": pod_name, "namespace": namespace,
                                     "labels": {**spec["template"]["metadata"]["labels"],
                                                "statefulset.kubernetes.io/pod-name": pod_name},
                                     "annotations": dict(spec["template"]["metadata"].get("annotations") or {}),
                                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name,
                                                          "uid": meta["uid"], "controller": True}]},
                        "spec": pod_spec, "status": status})
                    done += 1
                elif pod["status"].get("phase") == "Failed":
                    await self.request("DELETE", self.path("v1/pods", namespace, pod_name))
                    done += 1
                elif fits and pod["status"].get("phase") == "Pending" and not pod["spec"].get("schedulingGates"):
                    await self.request("PATCH", self.path("v1/pods", namespace, pod_name, "status"),
                                       {"status": _ready_status(containers)})
                    done += 1
            for pod_name, pod in pods.items():
                if int(pod_name.rsplit("-", 1)[1]) >= want and not pod["metadata"].get("deletionTimestamp"):
                    if pod_name in self.lingering:  # SIGTERM sent; the pod is gone once the test says so
                        await self.request("PATCH", self.path("v1/pods", namespace, pod_name),
                                           {"metadata": {"deletionTimestamp": now(), "finalizers": [LINGERING]}})
                    else:
                        await self.request("DELETE", self.path("v1/pods", namespace, pod_name))
                    done += 1
            live = [p for p in self.server.live("pods", namespace) if p["metadata"]["name"] in pods
                    or p["metadata"]["name"].startswith(f"{name}-")]
            ready = sum(1 for p in live if any(c.get("type") == "Ready" and c.get("status") == "True"
                                               for c in p["status"].get("conditions") or []))
            status = {"replicas": len(live), "readyReplicas": ready, "observedGeneration": meta.get("generation", 1)}
            if {k: (sts.get("status") or {}).get(k) for k in status} != status:
                await self.request("PATCH", self.path("apps/v1/statefulsets", namespace, name, "status"),
                                   {"status": status})
                done += 1
        return done

    # what a test stages

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.server.current(kmock.resource("v1/pods"), namespace, name)

    def pods(self, namespace: str, job: str, role: str | None = None) -> list[dict[str, Any]]:
        return sorted((p for p in self.server.live("pods", namespace)
                       if p["metadata"]["labels"].get(INSTANCE_KEY) == job
                       and (role is None or p["metadata"]["labels"].get(COMPONENT_KEY) == role)),
                      key=lambda p: p["metadata"]["name"])

    async def preempt(self, namespace: str, name: str) -> None:
        """What the scheduler does to a spot pod: mark it a disruption target and delete it (a pod with a
        deletionTimestamp and no finalizers is gone at once here; the watch sees both steps)."""
        pod = self.pod(namespace, name)
        assert pod is not None
        conditions = [*pod["status"].get("conditions", []),
                      {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                       "message": "Preempted in order to admit critical pod"}]
        await self.request("PATCH", self.path("v1/pods", namespace, name),
                           {"metadata": {"deletionTimestamp": now()}, "status": {"conditions": conditions}})

    async def taint_node_of(self, namespace: str, name: str, key: str, effect: str = "NoSchedule") -> None:
        """Put pod `name` on a node of its own (spec.nodeName, as the scheduler binds it) and give that node
        the taint `key`: what a cloud's termination handler or a node autoscaler does before the node goes."""
        node = f"node-of-{name}"
        await self.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                                                     "spec": {"taints": [{"key": key, "effect": effect}]}})
        await self.request("PATCH", self.path("v1/pods", namespace, name), {"spec": {"nodeName": node}})

    async def crash(self, namespace: str, name: str, exit_code: int = 1, reason: str = "Error") -> None:
        """What the kubelet reports after a container exited non-zero and was restarted: one more
        restart, waiting in CrashLoopBackOff, not ready."""
        pod = self.pod(namespace, name)
        assert pod is not None
        statuses = []
        for c in pod["status"]["containerStatuses"]:
            statuses.append({**c, "ready": False, "restartCount": int(c.get("restartCount", 0)) + 1,
                             "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                   "message": f"back-off restarting failed container {c['name']}"}},
                             "lastState": {"terminated": {"exitCode": exit_code, "reason": reason}}})
        conditions = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]
        await self.request("PATCH", self.path("v1/pods", namespace, name, "status"),
                           {"status": {"containerStatuses": statuses, "conditions": conditions}})

    async def restart(self, namespace: str, name: str, exit_code: int, reason: str) -> None:
        """What the kubelet reports after a container exited and was restarted in place, and runs again:
        one more restart, the exit as its last state, ready."""
        pod = self.pod(namespace, name)
        assert pod is not None
        statuses = [{**c, "ready": True, "restartCount": int(c.get("restartCount", 0)) + 1,
                     "state": {"running": {"startedAt": now()}},
                     "lastState": {"terminated": {"exitCode": exit_code, "reason": reason}}}
                    for c in pod["status"]["containerStatuses"]]
        await self.request("PATCH", self.path("v1/pods", namespace, name, "status"),
                           {"status": {"containerStatuses": statuses}})

    async def stopped(self, namespace: str, name: str) -> None:
        """A lingering pod's process exited: the pod is gone."""
        self.lingering.discard(name)
        await self.request("PATCH", self.path("v1/pods", namespace, name), {"metadata": {"finalizers": None}})

    async def admit(self, namespace: str, group: str) -> None:
        """What Kueue does for a pod group that fits its queue: once every pod of the group exists (its
        pod-group-total-count), remove their scheduling gates together; here they are then ready."""
        pods = [p for p in self.server.live("pods", namespace)
                if (p["metadata"].get("labels") or {}).get(KUEUE_GROUP_LABEL) == group]
        totals = {p["metadata"]["annotations"].get(KUEUE_TOTAL_ANNOTATION) for p in pods}
        assert totals == {str(len(pods))}, f"group {group}: {len(pods)} pods, total-count {totals}"
        self.admitted.add(group)
        for pod in pods:
            containers = [c["name"] for c in pod["spec"]["containers"]]
            await self.request("PATCH", self.path("v1/pods", namespace, pod["metadata"]["name"]),
                               {"spec": {"schedulingGates": None}, "status": _ready_status(containers)})

    def events(self, namespace: str, job: str) -> list[Mapping[str, Any]]:
        return [e for e in self.server.live("events", namespace) if e["involvedObject"]["name"] == job]
