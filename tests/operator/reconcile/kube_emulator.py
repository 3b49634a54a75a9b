"""A Kubernetes for the operator tests: kmock's in-process API server plus the cluster's own parts.

kmock stores objects and streams watch events, but it is no Kubernetes: no uid, resourceVersion or
generation, no server-side apply, no status and scale subresources, no garbage collector, no
StatefulSet controller, no scheduler, no kubelet, no validation, no label selectors; and it finds an
object by scanning every object it holds, on every request. `ApiServer` adds what the operator
relies on of the API server, and finds objects by key and lists one kind in one namespace (`_Objects`,
an index by kind), filtered by `labelSelector` (benchmarks/operator-scale runs 1,000 jobs on it); `Cluster.step` plays the garbage collector, the StatefulSet controller,
the scheduler and the kubelet, one round at a time, through the same HTTP API (so the operator sees
watch events); the StatefulSet controller is in statefulset_controller.py. RLJobs are pruned and
defaulted by the installed CRD's structural schema on every write and read (structural.py), as the API
server does; a pod create passes admission (Pod Security, webhooks a test registers, ResourceQuota:
admission_plugins.py). The operator under test is never part of this: it runs as in a cluster.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Mapping
from typing import Any

import admission_plugins
import aiohttp
import aiohttp.web
import attrs
import kmock
import structural
from admission_plugins import Webhook
from kmock._internal import dicts, enums, k8s_dicts, k8s_views, references, rendering
from statefulset_controller import KUEUE_GATE as KUEUE_GATE  # re-exported: what tests import from here
from statefulset_controller import LINGERING as LINGERING
from statefulset_controller import NO_GPU as NO_GPU
from statefulset_controller import REVISION as REVISION
from statefulset_controller import StatefulSetController, now, ready_status

from rhymerl.api.crd import crd
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
    "v1/persistentvolumeclaims": ("PersistentVolumeClaim", {"status"}),
    "v1/resourcequotas": ("ResourceQuota", {"status"}),
    "apps/v1/statefulsets": ("StatefulSet", {"status", "scale"}),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", {"status"}),
    "rbac.authorization.k8s.io/v1/roles": ("Role", set()),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", set()),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", set()),
}
FIXTURE_AGENT = "cluster-fixture"

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


def field_selected(obj: Mapping[str, Any], selector: str | None) -> bool:
    """Whether `obj` matches a field selector of `path=value` terms (`involvedObject.name=x,reason=y`)."""
    for path, _, value in (term.partition("=") for term in (selector or "").split(",") if term):
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if str(node or "") != value:
            return False
    return True


def rljob_schema(definition: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The openAPIV3Schema of a CRD `definition` (default: the one the chart ships, rhymerl.api.crd)."""
    body = crd() if definition is None else definition
    schema: dict[str, Any] = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return copy.deepcopy(schema)


def owner_reference_problem(meta: Mapping[str, Any]) -> str | None:
    """What the API server refuses in metadata.ownerReferences (k8s.io/apimachinery
    pkg/api/validation/objectmeta.go, ValidateOwnerReferences): a reference without apiVersion, kind, name
    or uid, or more than one with controller: true."""
    refs = meta.get("ownerReferences") or []
    for i, ref in enumerate(refs):
        missing = [k for k in ("apiVersion", "kind", "name", "uid") if not ref.get(k)]
        if missing:
            return f"metadata.ownerReferences[{i}].{missing[0]}: Invalid value: \"\": {missing[0]} must not be empty"
    if sum(1 for ref in refs if ref.get("controller")) > 1:
        return "metadata.ownerReferences: Invalid value: Only one reference can have Controller set to true"
    return None


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with uid, creationTimestamp, resourceVersion (and 409 on a stale one), generation
    (bumped when the spec changes, never by a status write), server-side apply creating missing objects,
    RLJob's status and scale subresources (status writes change only status; scale reads and writes
    spec.rollout.replicas), ownerReferences validated, and RLJobs pruned and defaulted by their CRD's
    structural schema (structural.py) on every write and every read, as the API server does: `schemas`
    holds the installed CRD's (`install_crd` replaces it, as applying a new CRD does)."""

    _versions = itertools.count(1)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_objects", _Objects())
        object.__setattr__(self, "schemas", {"rljobs": rljob_schema()})
        object.__setattr__(self, "webhooks", {})  # name -> a validating webhook for pod creates
        super().__attrs_post_init__()

    def register_webhook(self, name: str, hook: Webhook) -> None:
        """What a ValidatingWebhookConfiguration on pod creates does: `hook` may deny each one."""
        self.webhooks[name] = hook

    def label_namespace(self, namespace: str, labels: Mapping[str, str]) -> None:
        """Set namespace `namespace`'s labels (Pod Security's enforce label, for one)."""
        self.objects["v1/namespaces", None, namespace] = {"metadata": {"name": namespace, "labels": dict(labels)}}

    def _admit_pod(self, pod: dict[str, Any], namespace: str) -> None:
        """Pod Security, webhooks and ResourceQuota on a pod create (admission_plugins.py): raise the refusal."""
        found = self._objects._objects.get((k8s_views._parse_resource("v1/namespaces"), None, namespace))
        labels = ((found.raw if found is not None else {}).get("metadata") or {}).get("labels") or {}
        refusal = admission_plugins.admit(pod, labels, self.live("resourcequotas", namespace),
                                          self.live("pods", namespace), self.webhooks)
        if refusal is not None:
            raise kmock.KubernetesError(status=refusal.status, reason=refusal.reason, message=refusal.message)

    def install_crd(self, definition: Mapping[str, Any]) -> None:
        """What `kubectl apply` of a new RLJob CRD does: later writes and reads use its schema; stored
        objects stay as they are until written."""
        self.schemas["rljobs"] = rljob_schema(definition)

    def served(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """`obj` (as stored) as a read returns it: pruned and defaulted by the schema installed now."""
        schema = self.schemas.get(plural)
        return obj if schema is None else structural.stored(obj, schema)

    def _served_payload(self, request: rendering.Request, payload: Any) -> Any:
        plural = request.resource.plural if request.resource is not None else None
        if plural not in self.schemas or not isinstance(payload, dict):
            return payload
        if "items" in payload:
            return {**payload, "items": [self.served(plural, o) for o in payload["items"]]}
        if isinstance(payload.get("object"), dict) and "type" in payload:
            return {**payload, "object": self.served(plural, payload["object"])}
        return self.served(plural, payload)

    async def _serve_fetch(self, request: rendering.Request) -> rendering.Payload:
        return self._served_payload(request, await super()._serve_fetch(request))

    async def _serve_watch(self, request: rendering.Request) -> Any:
        async for event in super()._serve_watch(request):
            yield self._served_payload(request, event)

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
        selector, fields = request.params.get("labelSelector"), request.params.get("fieldSelector")
        if selector or fields:
            listed = {**listed, "items": [o for o in listed["items"] if selected(o, selector)
                                          and field_selected(o, fields)]}
        served: rendering.Payload = self._served_payload(request, listed)
        return served

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
        if request.action in (enums.action.CREATE, enums.action.UPDATE) and isinstance(request.data, dict):
            problem = owner_reference_problem(request.data.get("metadata") or {})
            if problem is not None:
                raise kmock.KubernetesError(status=422, reason="Invalid", message=problem)
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            if resource.plural == "pods" and request.namespace is not None \
                    and self.current(resource, request.namespace, (request.data.get("metadata") or {}).get("name")) is None:
                self._admit_pod(request.data, request.namespace)
            self._stamp_new(request.data, request.namespace)
            self._structural_create(resource.plural, request.data)
        elif request.action == enums.action.UPDATE and isinstance(request.data, dict):
            current = self.current(resource, request.namespace, request.name)
            if current is None:
                if "apply-patch" not in request.headers.get("Content-Type", ""):
                    raise kmock.KubernetesObjectNotFoundError()
                self._stamp_new(request.data, request.namespace)  # server-side apply creates
                self._structural_create(resource.plural, request.data)
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
        plural = request.resource.plural if request.resource is not None else ""
        if plural in self.schemas:
            self._structural_update(request, plural, current)
            return
        merged = dicts.patch_dict(copy.deepcopy(current), copy.deepcopy(data))
        meta = data.setdefault("metadata", {})
        if request.subresource is None and merged.get("spec") != current.get("spec"):
            meta["generation"] = int(current["metadata"].get("generation") or 1) + 1
        meta["resourceVersion"] = str(next(self._versions))

    def _structural_create(self, plural: str, data: dict[str, Any]) -> None:
        if plural in self.schemas:
            final = self.served(plural, data)
            data.clear()
            data.update(final)

    def _structural_update(self, request: rendering.Request, plural: str, current: dict[str, Any]) -> None:
        """An update as the API server makes it: applied to the object as read (defaulted), only its status
        through the status subresource and all but its status otherwise, then pruned and defaulted; the
        generation moves when the spec did. kmock gets the merge patch from the stored object to that."""
        data = request.data
        base = self.served(plural, current)
        if request.subresource == "status":
            wanted = dicts.patch_dict(base, {"status": copy.deepcopy(data.get("status"))})
        else:
            wanted = dicts.patch_dict(base, copy.deepcopy({k: v for k, v in data.items() if k != "status"}))
        final = self.served(plural, dict(wanted))
        meta = final.setdefault("metadata", {})
        meta["generation"] = int(base["metadata"].get("generation") or 1)
        if request.subresource is None and final.get("spec") != base.get("spec"):
            meta["generation"] += 1
        meta["resourceVersion"] = str(next(self._versions))
        patch = structural.merge_patch(current, final)
        data.clear()
        data.update(patch)

    async def _scale(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        job = self.current(request.resource, request.namespace, request.name)
        job = None if job is None else self.served("rljobs", job)
        if job is None:
            raise kmock.KubernetesObjectNotFoundError()
        if request.method == enums.method.PATCH:
            replicas = request.data["spec"]["replicas"]
            inner = attrs.evolve(request, subresource=None, data={"spec": {"rollout": {"replicas": replicas}}})
            await self._handle(self._swap(request, inner))
            self._swap(inner, request)
            job = self.served("rljobs", self.current(request.resource, request.namespace, request.name) or job)
        return aiohttp.web.json_response({
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": job["metadata"]["name"], "namespace": job["metadata"]["namespace"]},
            "spec": {"replicas": job["spec"]["rollout"]["replicas"]},
            "status": {"replicas": (job.get("status") or {}).get("replicas", 0),
                       "selector": (job.get("status") or {}).get("selector", "")},
        })


class Cluster(StatefulSetController):
    """The cluster around the API server: call `step` to let the garbage collector, the StatefulSet
    controller, the scheduler and the kubelet act once; the helpers below stage what a test needs
    (a preemption, a crash). `capacity[role]`: pods of that role the nodes can hold (default: all)."""

    def __init__(self, server: ApiServer, http: aiohttp.ClientSession) -> None:
        self.server = server
        self.http = http
        self.capacity: dict[str, int] = {}
        self.lingering: set[str] = set()  # pods a scale-down leaves Terminating (in their grace period)
        self.admitted: set[str] = set()  # Kueue pod groups admitted (others' pods are created gated)
        self.kueue_webhook = True  # False: Kueue's pod webhook skips the job's pods (no label, no gate)

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/merge-patch+json"
                      ) -> Any:
        status, data = await self.attempt(method, path, body, content_type)
        if status >= 300:
            raise AssertionError(f"{method} {path}: {status} {data}")
        return data

    async def attempt(self, method: str, path: str, body: Any = None,
                      content_type: str = "application/merge-patch+json") -> tuple[int, Any]:
        """A request whose refusal is an answer, not a failure: (HTTP status, body)."""
        headers = {"Content-Type": content_type if method == "PATCH" else "application/json"}
        async with self.http.request(method, path, json=body, headers=headers) as response:
            return response.status, await response.json(content_type=None)

    # the cluster's controllers

    async def step(self) -> int:
        """One round of every controller; returns how many writes they made."""
        return await self._collect_garbage() + await self._statefulsets()

    async def _collect_garbage(self) -> int:
        """The garbage collector, background propagation: an object all of whose owners are gone is deleted,
        one level a round (its own dependents in the next). An owner reference names an object by kind, name
        and uid in the dependent's namespace: one re-created under the same name, or in another namespace,
        is not its owner (kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents/)."""
        kinds = {kind: path.rsplit("/", 1)[1] for path, (kind, _) in RESOURCES.items()}
        alive = {(plural, o["metadata"].get("namespace"), o["metadata"]["name"], o["metadata"].get("uid"))
                 for plural in kinds.values() for o in self.server.live(plural)}
        done = 0
        for path in RESOURCES:
            plural = path.rsplit("/", 1)[1]
            for obj in self.server.live(plural):
                meta = obj["metadata"]
                owners = meta.get("ownerReferences") or []
                if owners and not any((kinds.get(ref.get("kind", ""), ""), meta.get("namespace"), ref.get("name"),
                                       ref.get("uid")) in alive for ref in owners):
                    await self.request("DELETE", self.path(path, meta["namespace"], meta["name"]))
                    done += 1
        return done

    @staticmethod
    def path(resource: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        group_version, plural = resource.rsplit("/", 1)
        root = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        return f"{root}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

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
        await self._disrupt(namespace, name, "PreemptionByScheduler", "Preempted in order to admit critical pod")

    async def evict(self, namespace: str, name: str) -> None:
        """What the Eviction API does for a drain or a node upgrade (pkg/registry/core/pod/storage/eviction.go
        adds the DisruptionTarget condition, reason EvictionByEvictionAPI, then deletes the pod)."""
        await self._disrupt(namespace, name, "EvictionByEvictionAPI", "Eviction API: evicting")

    async def _disrupt(self, namespace: str, name: str, reason: str, message: str) -> None:
        pod = self.pod(namespace, name)
        assert pod is not None
        conditions = [*pod["status"].get("conditions", []),
                      {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}]
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
                               {"spec": {"schedulingGates": None}, "status": ready_status(containers)})

    def events(self, namespace: str, job: str) -> list[Mapping[str, Any]]:
        return [e for e in self.server.live("events", namespace) if e["involvedObject"]["name"] == job]
