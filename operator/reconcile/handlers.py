"""Which events wake which job, one pass at a time per job, a periodic resync, and who may reconcile.

The operator's informers (watch.py) list and watch its RLJobs and, under its managed-by label, the
children it made and their pods; every event only wakes its job (`kick`), and the pass reads the job
and its children from the informers' cache (reconciler.reconcile through cluster.Cluster), so a pass
at rest makes no API call. A child changed by hand wakes the job too, and the resync loop (every
`resync_s`) passes over every cached job, as client-go's resync does, repairing what a lost write left.
kopf runs the process: login, startup and cleanup, the health probe. (`cached=False`: the kopf event
handlers of before, every read from the API; kept to measure the difference, benchmarks/operator-scale.)
Why not kopf's change handlers and timers: they keep state in the object (an annotation written after
every change) and a timer puts kopf's finalizer on every RLJob, while this operator writes nothing when
nothing changed and has a finalizer only where Redis needs cleaning.

With leader election (leader.py) only the Lease's holder runs passes; the other replica keeps its
cache warm and marks jobs dirty, and passes over every job the moment it takes over.

Per job, passes never overlap: a kick during a pass marks the job dirty and one more pass follows.
A failed pass (a 409 conflict, a timeout) is retried with backoff, at most every `resync_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from rhymerl.api.crd import PLURAL
from rhymerl.api.spec import GROUP, KIND, VERSION
from rhymerl.operator.manifests.labels import INSTANCE_KEY, MANAGED_BY, MANAGED_BY_KEY
from rhymerl.operator.reconcile.cluster import KINDS, NODE, POD, RLJOB, Cluster, now_rfc3339
from rhymerl.operator.reconcile.leader import LeaderElector
from rhymerl.operator.reconcile.metrics import Metrics
from rhymerl.operator.reconcile.nodes import trimmed
from rhymerl.operator.reconcile.reconciler import reconcile
from rhymerl.operator.reconcile.watch import OURS, Cache, Informer

log = logging.getLogger(__name__)
JobKey = tuple[str, str]
MAX_JOURNAL = 256  # deleted pods remembered per job until a pass counted them


@dataclass
class _Job:
    dirty: bool = False
    task: asyncio.Task[None] | None = None
    retry: asyncio.TimerHandle | None = None
    errors: int = 0
    gone: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # uid -> last body of a deleted pod


class Operator:
    """Serves the RLJobs of `namespaces` (None: every namespace) through `cluster`."""

    def __init__(self, cluster: Cluster, namespaces: list[str] | None, resync_s: float = 30.0,
                 retry_s: float = 1.0, max_parallel: int = 8, metrics: Metrics | None = None,
                 cached: bool = True, elector: LeaderElector | None = None) -> None:
        self.cluster = cluster
        self.cached = cached
        self.elector = elector
        self.leading = elector is None
        if elector is not None:
            elector.on_change = self._leading
        self._elect: asyncio.Task[None] | None = None
        self._takeover: asyncio.Task[None] | None = None
        self.namespaces = namespaces
        if cached and cluster.cache is None:
            cluster.cache = Cache(self._informers())
        self.synced = cluster.cache is None  # passes wait for the first full list of every kind
        self._sync: asyncio.Task[None] | None = None
        self.resync_s = resync_s
        self.retry_s = retry_s
        self.metrics = metrics or Metrics()
        self.last_resync = time.monotonic()
        self.passes = 0  # reconcile passes finished, failed ones included
        self.now: Callable[[], str] = now_rfc3339  # the clock of every pass (tests set it)
        self._jobs: dict[JobKey, _Job] = {}
        self._parallel = asyncio.Semaphore(max_parallel)
        self._resync: asyncio.Task[None] | None = None

    def _informers(self) -> list[Informer]:
        out = []
        for namespace in self.namespaces if self.namespaces is not None else [None]:
            for kind, info in [(KIND, RLJOB), *KINDS.items(), ("Pod", POD)]:
                out.append(Informer(self.cluster, info.plural, kind, namespace, None if info is RLJOB else OURS,
                                    self._job_event if info is RLJOB else self._child_event,
                                    api_version=f"{info.group}/{info.version}" if info.group else info.version))
        # the nodes' taints (nodes.py): every node, trimmed; without the permission, none (pods.py goes on)
        out.append(Informer(self.cluster, NODE.plural, "Node", None, None, lambda type_, body: None,
                            api_version=NODE.version, transform=trimmed, optional=True))
        return out

    def _job_event(self, type_: str, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata", {})
        if type_ == "DELETED":
            self.forget(meta["namespace"], meta["name"])
        else:
            self.kick(meta["namespace"], meta["name"])

    def _child_event(self, type_: str, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata", {})
        job = (meta.get("labels") or {}).get(INSTANCE_KEY)
        if not job:
            return
        if body.get("kind") == "Pod" and (type_ == "DELETED" or meta.get("deletionTimestamp")):
            self.pod_gone(meta["namespace"], job, body)
        self.kick(meta["namespace"], job)

    async def _await_sync(self) -> None:
        assert self.cluster.cache is not None
        await self.cluster.cache.synced()
        self.synced = True
        for key, state in list(self._jobs.items()):
            if state.dirty:
                self.kick(*key)

    def _leading(self, leading: bool) -> None:
        self.leading = leading
        if leading:
            for key in list(self._jobs):
                self.kick(*key)
            self._takeover = asyncio.get_running_loop().create_task(self.resync_once())
        else:
            for state in self._jobs.values():
                if state.task is not None and not state.task.done():
                    state.task.cancel()

    # scheduling

    def kick(self, namespace: str, name: str) -> None:
        """Make sure a pass of job `namespace/name` starts after this moment (once this replica leads)."""
        state = self._jobs.setdefault((namespace, name), _Job())
        state.dirty = True
        if not (self.leading and self.synced):
            return
        if state.task is None or state.task.done():
            state.task = asyncio.get_running_loop().create_task(self._run((namespace, name), state))

    def _later(self, key: JobKey, state: _Job, delay: float) -> None:
        if state.retry is not None:
            state.retry.cancel()
        state.retry = asyncio.get_running_loop().call_later(delay, self.kick, *key)

    async def _run(self, key: JobKey, state: _Job) -> None:
        while state.dirty:
            state.dirty = False
            gone = dict(state.gone)
            started = time.perf_counter()
            async with self._parallel:
                try:
                    outcome = await reconcile(self.cluster, key[0], key[1], list(gone.values()), self.now)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    state.errors += 1
                    delay = min(self.resync_s, self.retry_s * 2 ** min(state.errors - 1, 10))
                    kind = type(exc).__name__ + (f"_{exc.status}" if hasattr(exc, "status") else "")
                    self.metrics.reconciles.labels("error").inc()
                    self.metrics.errors.labels(kind).inc()
                    log.warning("%s/%s: reconcile failed (%s), retrying in %.1f s: %s", *key, kind, delay, exc)
                    self._later(key, state, delay)
                    continue
                finally:
                    self.passes += 1
                    self.metrics.seconds.observe(time.perf_counter() - started)
            state.errors = 0
            for uid in gone:
                state.gone.pop(uid, None)
            self.metrics.reconciles.labels("ok").inc()
            self.metrics.job_phase(key, outcome.phase)
            if outcome.phase is None:
                if self._jobs.get(key) is state:  # not a new job of the same name
                    self.forget(*key)
                return
            if outcome.requeue_after is not None:
                self._later(key, state, outcome.requeue_after)

    def forget(self, namespace: str, name: str) -> None:
        state = self._jobs.pop((namespace, name), None)
        if state is not None and state.retry is not None:
            state.retry.cancel()
        self.metrics.job_phase((namespace, name), None)

    def pod_gone(self, namespace: str, job: str, pod: Mapping[str, Any]) -> None:
        """Remember a deleted pod of `job` until a pass has counted it (it may vanish between passes)."""
        uid = pod.get("metadata", {}).get("uid")
        if uid:
            state = self._jobs.setdefault((namespace, job), _Job())
            state.gone[uid] = pod
            while len(state.gone) > MAX_JOURNAL:
                state.gone.pop(next(iter(state.gone)))

    async def resync_once(self) -> None:
        for body in await self.cluster.list_jobs(self.namespaces):
            meta = body.get("metadata", {})
            self.kick(meta["namespace"], meta["name"])
        self.last_resync = time.monotonic()

    async def _resync_forever(self) -> None:
        while True:
            await asyncio.sleep(self.resync_s)
            try:
                await self.resync_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("resync: cannot list RLJobs: %s", exc)

    async def idle(self) -> None:
        """Wait until no pass is running or pending (tests; a graceful stop)."""
        while True:
            tasks = [s.task for s in self._jobs.values() if s.task is not None and not s.task.done()]
            if not tasks:
                return
            await asyncio.wait(tasks)

    async def stop(self) -> None:
        if self._sync is not None:
            self._sync.cancel()
        if self._elect is not None:
            self._elect.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._elect
            self._elect = None
        if self._resync is not None:
            self._resync.cancel()
        for state in self._jobs.values():
            if state.retry is not None:
                state.retry.cancel()
            if state.task is not None:
                state.task.cancel()
        tasks = [t for t in [self._resync, *(s.task for s in self._jobs.values())] if t is not None]
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._resync = None
        if self.cluster.cache is not None:
            await self.cluster.cache.stop()
        if self.elector is not None:
            await self.elector.release()

    # kopf

    def register(self, registry: kopf.OperatorRegistry) -> kopf.OperatorRegistry:
        """Add this operator's handlers to `registry` (a kopf.SmartOperatorRegistry in a cluster: it logs in
        the way the kubernetes client does; tests add their own login handler)."""
        ours: dict[str, Any] = {MANAGED_BY_KEY: MANAGED_BY, INSTANCE_KEY: kopf.PRESENT}

        @kopf.on.startup(registry=registry)
        async def start(**_: Any) -> None:
            loop = asyncio.get_running_loop()
            if self.cluster.cache is not None:
                self.cluster.cache.start()
                self._sync = loop.create_task(self._await_sync())
            if self.elector is not None:
                self._elect = loop.create_task(self.elector.run())
            self._resync = loop.create_task(self._resync_forever())

        @kopf.on.cleanup(registry=registry)
        async def cleanup(**_: Any) -> None:
            await self.stop()

        @kopf.on.probe(id="resync", registry=registry)
        def resync_age(**_: Any) -> float:
            age = time.monotonic() - self.last_resync
            if age > 3 * self.resync_s + 60:
                raise kopf.PermanentError(f"no resync for {age:.0f} s")
            return round(age, 1)

        if self.cached:
            return registry

        @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
        async def rljob(type: str, namespace: str | None, name: str, **_: Any) -> None:
            if namespace is None:
                return
            if type == "DELETED":
                self.forget(namespace, name)
            else:
                self.kick(namespace, name)

        @kopf.on.event("apps", "v1", "statefulsets", labels=ours, registry=registry)
        async def statefulset(namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
            if namespace is not None:
                self.kick(namespace, labels[INSTANCE_KEY])

        @kopf.on.event("", "v1", "pods", labels=ours, registry=registry)
        async def pod(type: str, body: kopf.Body, namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
            if namespace is None:
                return
            job = labels[INSTANCE_KEY]
            if type == "DELETED" or body.get("metadata", {}).get("deletionTimestamp"):
                self.pod_gone(namespace, job, dict(body))
            self.kick(namespace, job)

        return registry
