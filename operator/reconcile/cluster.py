"""The operator's only door to the Kubernetes API: read a job's children, apply, delete, patch status.

One generic REST path for every kind (the kinds are data, KINDS), on the official client's asyncio
ApiClient, so that the handlers share kopf's event loop. Children are written with server-side apply
under one field manager: the API server merges our fields with everyone else's and drops a field we
stop setting. Every write is counted (`writes`), which is how the tests prove an idle pass writes nothing.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

from kubernetes.aio.client import ApiClient
from kubernetes.aio.client.exceptions import ApiException

from rhymerl.api.crd import PLURAL
from rhymerl.api.spec import API_VERSION, GROUP, KIND, VERSION
from rhymerl.operator.manifests.labels import INSTANCE_KEY, MANAGED_BY, MANAGED_BY_KEY
from rhymerl.operator.reconcile.diff import Manifest, ObjectRef
from rhymerl.operator.reconcile.nodes import disruption
from rhymerl.operator.reconcile.pods import node_name
from rhymerl.operator.reconcile.watch import PAGE, Cache

log = logging.getLogger(__name__)
FIELD_MANAGER = "rhymerl-operator"
USER_AGENT = f"rhymerl-operator/{version('rhymerl')}"
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        root = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        out = root + (f"/namespaces/{namespace}" if namespace else "") + f"/{self.plural}"
        return out + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


# Every kind the builders emit (rhymerl.operator.manifests.desired), and what the operator reads.
KINDS: dict[str, Kind] = {
    "ConfigMap": Kind("", "v1", "configmaps"),
    "ServiceAccount": Kind("", "v1", "serviceaccounts"),
    "Role": Kind("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": Kind("rbac.authorization.k8s.io", "v1", "rolebindings"),
    "Service": Kind("", "v1", "services"),
    "StatefulSet": Kind("apps", "v1", "statefulsets"),
    "PodDisruptionBudget": Kind("policy", "v1", "poddisruptionbudgets"),
    "NetworkPolicy": Kind("networking.k8s.io", "v1", "networkpolicies"),
}
POD = Kind("", "v1", "pods")
EVENT = Kind("", "v1", "events")
SECRET = Kind("", "v1", "secrets")
RLJOB = Kind(GROUP, VERSION, PLURAL)
LEASE = Kind("coordination.k8s.io", "v1", "leases")
NODE = Kind("", "v1", "nodes")
BY_PLURAL: dict[str, Kind] = {k.plural: k for k in [*KINDS.values(), POD, RLJOB, NODE]}


def ours(obj: Mapping[str, Any], job: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return labels.get(INSTANCE_KEY) == job and labels.get(MANAGED_BY_KEY) == MANAGED_BY


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def job_selector(job: str) -> str:
    return f"{INSTANCE_KEY}={job},{MANAGED_BY_KEY}={MANAGED_BY}"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Cluster:
    """Async access to the API server through `api`; `on_write(verb, kind)` hears of every write. With a
    `cache` (watch.py), reads of a kind its informers listed come from memory and writes update it."""

    def __init__(self, api: ApiClient, timeout_s: float = 30.0,
                 on_write: Callable[[str, str], None] | None = None, cache: Cache | None = None) -> None:
        self.api = api
        self.cache = cache
        self.calls: Counter[str] = Counter()  # API requests by method (watches included)
        self.api.user_agent = USER_AGENT
        self.timeout_s = timeout_s
        self.writes: Counter[tuple[str, str]] = Counter()
        self._on_write = on_write
        self._host = socket.gethostname()
        self._created: set[tuple[str, str, str]] = set()  # (namespace, name, owner uid) create_once made
        self._events_forbidden = False

    async def _call(self, method: str, path: str, *, query: Sequence[tuple[str, str]] = (),
                    body: Any = None, content_type: str = JSON) -> Any:
        self.calls[method] += 1
        serialized = await self.api.param_serialize(
            method, path, query_params=list(query), body=body, auth_settings=["BearerToken"],
            header_params={"Content-Type": content_type, "Accept": JSON})
        response = await self.api.call_api(*serialized, _request_timeout=self.timeout_s)
        data = await response.read()
        text = data.decode("utf-8", "replace") if data else ""
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=text, data=None)
        return json.loads(text) if text else None

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """One request, for a caller that handles its error statuses itself (redis_secret_rest.py)."""
        return await self._call(method, path, body=body)

    def _wrote(self, verb: str, kind: str) -> None:
        self.writes[(verb, kind)] += 1
        if self._on_write is not None:
            self._on_write(verb, kind)

    # reads

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.cache is not None:
            cached, found = self.cache.get(KIND, namespace, name)
            if cached:
                fresh: dict[str, Any] | None = copy.deepcopy(found)
                return fresh
        try:
            job: dict[str, Any] = await self._call("GET", RLJOB.path(namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        if self.cache is not None:
            self.cache.wrote(KIND, job)
        return job

    async def list_jobs(self, namespaces: Sequence[str] | None) -> list[dict[str, Any]]:
        """Every RLJob in `namespaces` (None: in every namespace), page by page."""
        found: list[dict[str, Any]] = []
        for namespace in namespaces if namespaces is not None else [None]:
            if self.cache is not None and self.cache.ready(KIND, namespace or ""):
                found += [{"metadata": {"namespace": ns, "name": n}} for ns, n in self.cache.names(KIND)
                          if namespace is None or ns == namespace]
                continue
            cont: str | None = None
            while True:
                listed = await self.list_page(RLJOB.plural, namespace, None, PAGE, cont)
                found += listed.get("items") or []
                cont = (listed.get("metadata") or {}).get("continue") or None
                if cont is None:
                    break
        return found

    async def list_page(self, plural: str, namespace: str | None, selector: str | None, limit: int,
                        cont: str | None) -> Mapping[str, Any]:
        """One page of a list (`limit` objects at most; `cont`: the previous page's continue token)."""
        query = [("limit", str(limit))] + ([("labelSelector", selector)] if selector else []) + \
            ([("continue", cont)] if cont else [])
        listed: Mapping[str, Any] = await self._call("GET", BY_PLURAL[plural].path(namespace), query=query)
        return listed

    async def watch(self, plural: str, namespace: str | None, selector: str | None, resource_version: str,
                    timeout_s: int) -> AsyncIterator[Mapping[str, Any]]:
        """The events of one watch request from `resource_version`, until the server ends it (`timeout_s`)."""
        query = [("watch", "true"), ("allowWatchBookmarks", "true"), ("resourceVersion", resource_version),
                 ("timeoutSeconds", str(timeout_s))] + ([("labelSelector", selector)] if selector else [])
        self.calls["WATCH"] += 1
        serialized = await self.api.param_serialize(
            "GET", BY_PLURAL[plural].path(namespace), query_params=query, auth_settings=["BearerToken"],
            header_params={"Accept": JSON})
        response = await self.api.call_api(*serialized, _request_timeout=timeout_s + self.timeout_s)
        if not 200 <= response.status <= 299:
            text = (await response.read()).decode("utf-8", "replace")
            raise ApiException.from_response(http_resp=response, body=text, data=None)
        stream = response.response
        try:
            async for line in stream.content:
                if line.strip():
                    yield json.loads(line)
        finally:
            stream.release()

    async def _list(self, kind: Kind, namespace: str, job: str) -> list[dict[str, Any]]:
        kind_name = {v: k for k, v in KINDS.items()}.get(kind, "Pod")
        if self.cache is not None:
            cached = self.cache.children(kind_name, namespace, job)
            if cached is not None:  # the cache's own objects, not copies: a pass reads them and never changes
                # them (test_scale checks), and copying every child and pod was half of a pass at rest
                return [obj for obj in cached if ours(obj, job)]
        listed = await self._call("GET", kind.path(namespace), query=[("labelSelector", job_selector(job))])
        items = listed.get("items") or []
        api_version = f"{kind.group}/{kind.version}" if kind.group else kind.version
        out = []
        for item in items:
            if ours(item, job):  # the selector again: not every API server (nor every test double) filters
                out.append({"apiVersion": api_version, "kind": kind_name, **item})
        return out

    async def list_children(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """Every object of a kind the builders emit that carries job `job`'s labels."""
        found: list[dict[str, Any]] = []
        for kind in KINDS.values():
            found += await self._list(kind, namespace, job)
        return found

    async def list_kind(self, kind: str, namespace: str, job: str) -> list[dict[str, Any]]:
        """The children of one kind (a key of KINDS) that carry job `job`'s labels."""
        return await self._list(KINDS[kind], namespace, job)

    async def list_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return await self._list(POD, namespace, job)

    async def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        """The Events matching `field_selector` (admission.Short says which); none, and no more requests, once
        the API server said the operator may not list Events (403: the chart grants it, docs/operations.md)."""
        if self._events_forbidden:
            return []
        try:
            listed = await self._call("GET", EVENT.path(namespace), query=[("fieldSelector", field_selector)])
        except ApiException as exc:
            if exc.status != 403:
                raise
            self._events_forbidden = True
            log.warning("the operator may not list Events (403 Forbidden): pods refused at admission (quota, Pod "
                        "Security, a webhook) are not reported in job status: %s", exc.reason or exc.status)
            return []
        return list(listed.get("items") or [])

    def node_disruption(self, pod: Mapping[str, Any]) -> str | None:
        """Why the node of `pod` is being taken away (nodes.disruption), from the Node informer; None when
        it is not, or not known (no cache, the pod has no node, or the operator may not list nodes)."""
        node = node_name(pod)
        if self.cache is None or not node:
            return None
        cached, found = self.cache.get("Node", "", node)
        if not cached or found is None:
            return None
        return disruption(node, (found.get("spec") or {}).get("taints") or [])

    async def read_secret(self, namespace: str, name: str, key: str) -> str | None:
        """The decoded value of one key of a Secret; None when the Secret or the key is missing, or the
        operator may not read it."""
        try:
            secret = await self._call("GET", SECRET.path(namespace, name))
        except ApiException as exc:
            if exc.status in (403, 404):  # forbidden: the operator may not read Secrets (see history.py)
                return None
            raise
        value = (secret.get("data") or {}).get(key)
        return base64.b64decode(value).decode() if value is not None else None

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The leader-election Lease (leader.py); None if there is none."""
        try:
            lease: dict[str, Any] = await self._call("GET", LEASE.path(namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return lease

    async def write_lease(self, namespace: str, body: Mapping[str, Any], create: bool) -> dict[str, Any]:
        """Create the Lease, or replace it if it is still the version read (else 409)."""
        if create:
            lease: dict[str, Any] = await self._call("POST", LEASE.path(namespace), body=body)
        else:
            lease = await self._call("PUT", LEASE.path(namespace, body["metadata"]["name"]), body=body)
        return lease

    # writes

    async def apply(self, obj: Manifest) -> dict[str, Any]:
        """Create or update `obj` by server-side apply (forced: the operator owns these fields)."""
        kind = KINDS[obj["kind"]]
        meta = obj["metadata"]
        result: dict[str, Any] = await self._call(
            "PATCH", kind.path(meta["namespace"], meta["name"]), body=obj, content_type=APPLY_PATCH,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")])
        self._wrote("apply", obj["kind"])
        if self.cache is not None:
            self.cache.wrote(obj["kind"], result)
        return result

    async def someone_elses(self, obj: Manifest, uid: str) -> str | None:
        """Whose the object of `obj`'s kind and name is, when it exists and the job `uid` does not own it
        (a person's, another controller's, an earlier job's of the same name not yet collected): an apply
        would take it over, so the caller writes nothing. None when there is none, or it is the job's (a
        child whose labels someone edited)."""
        kind = KINDS[obj["kind"]]
        meta = obj["metadata"]
        try:
            current: dict[str, Any] = await self._call("GET", kind.path(meta["namespace"], meta["name"]))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        if owned_by(current, uid):
            return None
        owners = [f"{o.get('kind')}/{o.get('name')}" for o in current.get("metadata", {}).get("ownerReferences") or []]
        return f"owned by {', '.join(owners)}" if owners else "made by someone else (no owner)"

    async def create_once(self, obj: Manifest) -> bool:
        """Create `obj` unless it exists (a 409 leaves it as it is: never read, never rewritten). True if this
        process created it for its owner (now, or in an earlier call: no second request); False when it
        exists and this process did not create it (whose it is, the caller decides: reconcile/token.py).
        For the job's Ray token Secret: the operator may create Secrets, not read them."""
        meta = obj["metadata"]
        owners = meta.get("ownerReferences") or [{}]
        key = (meta["namespace"], meta["name"], str(owners[0].get("uid", "")))
        if key in self._created:
            return True
        try:
            kind = SECRET if obj["kind"] == "Secret" else KINDS[obj["kind"]]
            await self._call("POST", kind.path(meta["namespace"]), body=obj)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return False
        self._created.add(key)
        self._wrote("create", obj["kind"])
        return True

    async def delete(self, namespace: str, ref: ObjectRef) -> None:
        """Delete one child; its pods and the like go with it (background garbage collection)."""
        try:
            await self._call("DELETE", KINDS[ref.kind].path(namespace, ref.name),
                             query=[("propagationPolicy", "Background")])
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._wrote("delete", ref.kind)
        if self.cache is not None:
            self.cache.deleted(ref.kind, namespace, ref.name)

    async def scale_to_zero(self, namespace: str, name: str) -> None:
        """StatefulSet `name` to zero replicas, by a merge patch of that one field (a deleted job's: the
        operator applies no more manifests for it)."""
        result = await self._call("PATCH", KINDS["StatefulSet"].path(namespace, name),
                                  body={"spec": {"replicas": 0}}, content_type=MERGE_PATCH,
                                  query=[("fieldManager", FIELD_MANAGER)])
        self._wrote("patch", "StatefulSet")
        if self.cache is not None:
            self.cache.wrote("StatefulSet", result)

    async def delete_job(self, namespace: str, name: str) -> None:
        """Delete the RLJob (its time to live ran out); its children go with it (background collection)."""
        try:
            await self._call("DELETE", RLJOB.path(namespace, name), query=[("propagationPolicy", "Background")])
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._wrote("delete", KIND)
        if self.cache is not None:
            self.cache.deleted(KIND, namespace, name)

    async def delete_pod(self, namespace: str, name: str) -> None:
        try:
            await self._call("DELETE", POD.path(namespace, name))
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._wrote("delete", "Pod")

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge `status` into the job's status (the status subresource: spec and metadata untouched)."""
        result = await self._call("PATCH", RLJOB.path(namespace, name, "status"), body={"status": dict(status)},
                                  content_type=MERGE_PATCH)
        self._wrote("patch", "RLJob/status")
        if self.cache is not None:
            self.cache.wrote(KIND, result)

    async def set_finalizers(self, job: Mapping[str, Any], finalizers: Sequence[str]) -> None:
        """Replace the job's finalizers, if it has not changed since it was read (else 409)."""
        meta = job["metadata"]
        patch: dict[str, Any] = {"metadata": {"finalizers": list(finalizers) or None}}
        if meta.get("resourceVersion"):
            patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
        try:
            result = await self._call("PATCH", RLJOB.path(meta["namespace"], meta["name"]), body=patch,
                                      content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status == 409 and self.cache is not None:
                self.cache.stale(KIND, meta["namespace"], meta["name"])
            raise
        self._wrote("patch", "RLJob")
        if self.cache is not None:
            self.cache.wrote(KIND, result)

    async def event(self, job: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Record a Kubernetes Event about `job` (what `kubectl describe rljob` lists); a refused or failed
        post is logged, not raised."""
        meta = job["metadata"]
        stamp = now_rfc3339()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid", "")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": FIELD_MANAGER, "host": self._host},
            "reportingComponent": f"{GROUP}/operator", "reportingInstance": self._host,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        try:
            await self._call("POST", EVENT.path(meta["namespace"]), body=body)
        except ApiException as exc:  # best effort, as client-go's recorder: the status says the same
            log.warning("%s/%s: cannot record the event %s: %s", meta["namespace"], meta["name"], reason,
                        exc.reason or exc.status)
            return
        self._wrote("create", "Event")
