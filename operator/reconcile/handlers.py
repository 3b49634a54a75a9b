"""The kopf side: which events wake which job, one pass at a time per job, and a periodic resync.

Handlers are kopf *event* handlers on RLJobs and on the StatefulSets and pods the operator labelled:
each one only wakes its job (`kick`); the pass itself reads everything fresh (reconciler.reconcile). An
RLJob's first event after a start is its `resume`, an ADDED its `create`, a MODIFIED its `update`; a
child changed by hand wakes the job too, and the resync loop (every `resync_s`) repairs anything a
missed event left behind. Why not kopf's change handlers and timers: they keep state in the object
(an annotation written after every change) and a timer puts kopf's finalizer on every RLJob, while this
operator writes nothing when nothing changed and has a finalizer only where Redis needs cleaning.

Per job, passes never overlap: a kick during a pass marks the job dirty and one more pass follows.
A failed pass (a 409 conflict, a timeout) is retried with backoff, at most every `resync_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from rhymerl.api.crd import PLURAL
from rhymerl.api.spec import GROUP, VERSION
from rhymerl.operator.manifests.labels import INSTANCE_KEY, MANAGED_BY, MANAGED_BY_KEY
from rhymerl.operator.reconcile.cluster import Cluster
from rhymerl.operator.reconcile.metrics import Metrics
from rhymerl.operator.reconcile.reconciler import reconcile

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
                 retry_s: float = 1.0, max_parallel: int = 8, metrics: Metrics | None = None) -> None:
        self.cluster = cluster
        self.namespaces = namespaces
        self.resync_s = resync_s
        self.retry_s = retry_s
        self.metrics = metrics or Metrics()
        self.last_resync = time.monotonic()
        self.passes = 0  # reconcile passes finished, failed ones included
        self._jobs: dict[JobKey, _Job] = {}
        self._parallel = asyncio.Semaphore(max_parallel)
        self._resync: asyncio.Task[None] | None = None

    # scheduling

    def kick(self, namespace: str, name: str) -> None:
        """Make sure a pass of job `namespace/name` starts after this moment."""
        state = self._jobs.setdefault((namespace, name), _Job())
        state.dirty = True
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
                    outcome = await reconcile(self.cluster, key[0], key[1], list(gone.values()))
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

    # kopf

    def register(self, registry: kopf.OperatorRegistry) -> kopf.OperatorRegistry:
        """Add this operator's handlers to `registry` (a kopf.SmartOperatorRegistry in a cluster: it logs in
        the way the kubernetes client does; tests add their own login handler)."""
        ours: dict[str, Any] = {MANAGED_BY_KEY: MANAGED_BY, INSTANCE_KEY: kopf.PRESENT}

        @kopf.on.startup(registry=registry)
        async def start(**_: Any) -> None:
            self._resync = asyncio.get_running_loop().create_task(self._resync_forever())

        @kopf.on.cleanup(registry=registry)
        async def cleanup(**_: Any) -> None:
            await self.stop()

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

        @kopf.on.probe(id="resync", registry=registry)
        def resync_age(**_: Any) -> float:
            age = time.monotonic() - self.last_resync
            if age > 3 * self.resync_s + 60:
                raise kopf.PermanentError(f"no resync for {age:.0f} s")
            return round(age, 1)

        return registry
