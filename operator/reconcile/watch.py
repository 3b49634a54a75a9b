"""Informers: the operator's own list+watch of its RLJobs and of the children it labelled, kept in memory.

Why not kopf's watches: kopf (1.45) can put a label selector on a watch and chunk its lists, but it
relists after a 410 Gone without telling its handlers which objects went in the gap, and it has no
"this kind is fully listed" signal a cache could trust. An informer here does what client-go's does:
a paginated list (`limit`/`continue`) replaces its store and reports the objects that are gone, then a
watch from the list's resourceVersion (bookmarks on, so an idle watch resumes from a recent version),
and a 410 Gone (that version is too old) lists again. Child kinds are watched under the operator's
managed-by label, server-side: the API server never sends other people's pods.

Nodes are cluster-scoped and cannot be label-selected, so the Node informer (for their taints: nodes.py)
keeps only a trimmed copy of each (`transform`), and is `optional`: without the permission to list nodes
(403) it says so once and stops, and the operator counts preemptions from the pods alone.

The store serves a reconcile pass (`Cache`): no API call when nothing changed. A write the operator
made is put into the store from the write's response (`Cache.wrote`), and an event never replaces an
object with an older resourceVersion, so the next pass reads its own writes. An event that carries just
what the store holds (a watch that started again and replayed its objects) wakes no job: at 1,000 jobs
such a replay cost ten passes of every job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rhymerl.operator.manifests.labels import INSTANCE_KEY, MANAGED_BY, MANAGED_BY_KEY

log = logging.getLogger(__name__)
OURS = f"{MANAGED_BY_KEY}={MANAGED_BY}"
PAGE = 500  # objects per list request (client-go's default chunk size)
Key = tuple[str, str]  # (namespace, name)
OnEvent = Callable[[str, Mapping[str, Any]], None]  # ("ADDED" | "MODIFIED" | "DELETED", object)


class Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class Source(Protocol):
    """The API calls an informer needs (cluster.Cluster has them; tests pass their own)."""

    async def list_page(self, plural: str, namespace: str | None, selector: str | None, limit: int,
                        cont: str | None) -> Mapping[str, Any]: ...

    def watch(self, plural: str, namespace: str | None, selector: str | None, resource_version: str,
              timeout_s: int) -> AsyncIterator[Mapping[str, Any]]: ...


def newer(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Whether `new` is not older than `old` by resourceVersion. Kubernetes calls resourceVersions opaque,
    but etcd's are increasing integers; anything else counts as newer (the event stream's order)."""
    a, b = (o.get("metadata", {}).get("resourceVersion") for o in (new, old))
    if isinstance(a, str) and isinstance(b, str) and a.isdigit() and b.isdigit():
        return int(a) >= int(b)
    return True


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata", {})
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


@dataclass
class Informer:
    """One kind (`plural` of `kind`) in one namespace (None: all), under label `selector` (None: all)."""

    source: Source
    plural: str
    kind: str
    namespace: str | None
    selector: str | None
    on_event: OnEvent
    api_version: str = ""  # set on every stored object (watch events and list items may lack it)
    page: int = PAGE
    timeout_s: int = 300
    retry_s: float = 1.0
    store: dict[Key, dict[str, Any]] = field(default_factory=dict)
    by_job: dict[Key, dict[str, dict[str, Any]]] = field(default_factory=dict)  # (namespace, job) -> name -> obj
    resource_version: str | None = None
    synced: bool = False
    listed: asyncio.Event = field(default_factory=asyncio.Event)
    lists: int = 0  # full lists done (the first, then one per 410 Gone)
    transform: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None  # what of an object is kept
    written: dict[Key, str] = field(default_factory=dict)  # objects stored from our writes' responses: version
    optional: bool = False  # forbidden (403): stop, counted as listed so that no pass waits for it

    # the store

    def _index(self, obj: Mapping[str, Any]) -> Key | None:
        labels = obj.get("metadata", {}).get("labels") or {}
        if self.selector is None or INSTANCE_KEY not in labels:
            return None
        return str(obj.get("metadata", {}).get("namespace") or ""), str(labels[INSTANCE_KEY])

    def selects(self, obj: Mapping[str, Any]) -> bool:
        """The selector again, client-side (only `key=value` terms): not every API server, nor kmock, filters."""
        if self.selector is None:
            return True
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(labels.get(k) == v for k, _, v in (term.partition("=") for term in self.selector.split(",")))

    def put(self, obj: Mapping[str, Any]) -> bool:
        """Store `obj` unless the store holds a newer version; True if stored."""
        key = _key(obj)
        old = self.store.get(key)
        if old is not None and not newer(obj, old):
            return False
        if old is not None:
            self._unindex(key, old)
        kept = obj if self.transform is None else self.transform(obj)
        stored = {**kept, "apiVersion": self.api_version or obj.get("apiVersion"), "kind": self.kind}
        self.store[key] = stored
        job = self._index(stored)
        if job is not None:
            self.by_job.setdefault(job, {})[key[1]] = stored
        return True

    def _known(self, obj: Mapping[str, Any]) -> bool:
        """The store holds `obj` as it is already (the same resourceVersion and the same content: an emulator
        may change an object without a new version)."""
        old = self.store.get(_key(obj))
        version = obj.get("metadata", {}).get("resourceVersion")
        if old is None or not version or old.get("metadata", {}).get("resourceVersion") != version:
            return False
        kept = obj if self.transform is None else self.transform(obj)
        return all(old.get(k) == v for k, v in kept.items() if k not in ("apiVersion", "kind"))

    def drop(self, key: Key, obj: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """Remove `key` (unless `obj`, a deletion event, is older than what the store holds)."""
        old = self.store.get(key)
        if old is None or (obj is not None and not newer(obj, old)):
            return None
        del self.store[key]
        self._unindex(key, old)
        return old

    def _unindex(self, key: Key, old: Mapping[str, Any]) -> None:
        job = self._index(old)
        if job is not None and job in self.by_job:
            self.by_job[job].pop(key[1], None)
            if not self.by_job[job]:
                del self.by_job[job]

    def of_job(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return list(self.by_job.get((namespace, job), {}).values())

    # the API

    async def relist(self) -> None:
        """List every object, page by page, and make the store exactly that; objects the store held and
        the list lacks were deleted while nobody watched: reported as DELETED."""
        items: dict[Key, Mapping[str, Any]] = {}
        cont: str | None = None
        version = ""
        while True:
            page = await self.source.list_page(self.plural, self.namespace, self.selector, self.page, cont)
            for item in page.get("items") or []:
                if self.selects(item):
                    items[_key(item)] = item
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            cont = meta.get("continue") or None
            if cont is None:
                break
        for key in [k for k in self.store if k not in items]:
            old = self.drop(key)
            if old is not None:
                self.on_event("DELETED", old)
        for key, item in items.items():
            old = self.store.get(key)
            same = old is not None and old.get("metadata", {}).get("resourceVersion") == \
                item.get("metadata", {}).get("resourceVersion")
            if not same:
                if old is not None:
                    self.drop(key)
                self.put(item)
                self.on_event("MODIFIED" if old is not None else "ADDED", self.store[key])
        self.resource_version = version or None
        self.lists += 1
        self.synced = True
        self.listed.set()

    def apply(self, event: Mapping[str, Any]) -> None:
        """One watch event; raises Gone for a 410."""
        type_ = event.get("type")
        obj = event.get("object") or {}
        if type_ == "ERROR":
            if obj.get("code") == 410:
                raise Gone(str(obj.get("message", "")))
            raise RuntimeError(f"watch of {self.plural}: {obj}")
        version = obj.get("metadata", {}).get("resourceVersion")
        if type_ == "BOOKMARK":
            self.resource_version = version or self.resource_version
            return
        if type_ == "DELETED" or (type_ in ("ADDED", "MODIFIED") and not self.selects(obj)):
            if self.drop(_key(obj), obj) is not None:
                self.on_event("DELETED", obj)
        elif type_ in ("ADDED", "MODIFIED") and self._known(obj) and self.written.get(_key(obj)) != version:
            pass  # the very version stored (a watch started again and replayed it): nothing to pass over
        elif type_ in ("ADDED", "MODIFIED") and self.put(obj):
            self.written.pop(_key(obj), None)  # the event of a write of ours wakes its job, as any event
            self.on_event(str(type_), self.store[_key(obj)])
        self.resource_version = version or self.resource_version

    async def watch_once(self) -> int:
        """List if needed, then follow one watch request until the server ends it. Returns the events seen."""
        if self.resource_version is None:
            await self.relist()
        assert self.resource_version is not None
        seen = 0
        try:
            async for event in self.source.watch(self.plural, self.namespace, self.selector,
                                                 self.resource_version, self.timeout_s):
                seen += 1
                self.apply(event)
        except Gone:
            log.info("watch of %s in %s: resourceVersion too old, listing again", self.plural,
                     self.namespace or "every namespace")
            self.resource_version = None
        return seen

    async def run(self) -> None:
        while True:
            try:
                started = asyncio.get_running_loop().time()
                if not await self.watch_once() and asyncio.get_running_loop().time() - started < self.retry_s:
                    await asyncio.sleep(self.retry_s)  # a watch the server ends at once: no busy loop
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if getattr(exc, "status", None) == 410:
                    self.resource_version = None
                    continue
                if self.optional and getattr(exc, "status", None) == 403:
                    log.warning("%s: the operator may not list them (403 Forbidden), so it goes on without them: %s",
                                self.plural, getattr(exc, "reason", None) or exc)
                    self.listed.set()
                    return
                log.warning("watch of %s in %s failed, again in %.0f s: %s", self.plural,
                            self.namespace or "every namespace", self.retry_s, exc)
                await asyncio.sleep(self.retry_s)


class Cache:
    """The informers of every kind a pass reads, by kind name; a kind's reads come from here once all of
    its informers listed (`ready`), else from the API."""

    def __init__(self, informers: Sequence[Informer]) -> None:
        self.informers: dict[str, list[Informer]] = {}
        for informer in informers:
            self.informers.setdefault(informer.kind, []).append(informer)
        self._tasks: list[asyncio.Task[None]] = []
        self._stale: set[tuple[str, str, str]] = set()

    def _for(self, kind: str, namespace: str) -> Informer | None:
        for informer in self.informers.get(kind, []):
            if informer.synced and informer.namespace in (None, namespace):
                return informer
        return None

    def ready(self, kind: str, namespace: str) -> bool:
        return self._for(kind, namespace) is not None

    def children(self, kind: str, namespace: str, job: str) -> list[dict[str, Any]] | None:
        """Job `job`'s objects of `kind` (None: not cached, ask the API)."""
        informer = self._for(kind, namespace)
        return None if informer is None else informer.of_job(namespace, job)

    def get(self, kind: str, namespace: str, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(cached, object): object None with cached True means it does not exist."""
        informer = self._for(kind, namespace)
        if informer is None or (kind, namespace, name) in self._stale:
            return False, None
        return True, informer.store.get((namespace, name))

    def names(self, kind: str) -> list[Key]:
        return [key for informer in self.informers.get(kind, []) for key in informer.store]

    def wrote(self, kind: str, obj: Mapping[str, Any] | None) -> None:
        """The API server's answer to a write of ours: the object as it is now."""
        if not isinstance(obj, Mapping) or not obj.get("metadata", {}).get("name"):
            return
        namespace = str(obj["metadata"].get("namespace") or "")
        self._stale.discard((kind, namespace, str(obj["metadata"]["name"])))
        informer = self._for(kind, namespace)
        if informer is not None and informer.selects(obj) and informer.put(obj):
            informer.written[_key(obj)] = str(obj["metadata"].get("resourceVersion") or "")

    def deleted(self, kind: str, namespace: str, name: str) -> None:
        informer = self._for(kind, namespace)
        if informer is not None:
            informer.drop((namespace, name))

    def stale(self, kind: str, namespace: str, name: str) -> None:
        """A write against the cached object was refused with 409 (it is older than the server's): read it
        from the API until a response of the server replaces it (`wrote`)."""
        self._stale.add((kind, namespace, name))

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(i.run()) for group in self.informers.values() for i in group]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    async def synced(self) -> None:
        """Wait until every informer listed once."""
        for group in self.informers.values():
            for informer in group:
                await informer.listed.wait()
