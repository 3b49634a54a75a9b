"""The operator tests' harness: the cluster of one test (kube_emulator.py) with the operator running against
it as in a cluster (kopf, the real API client, its own thread), polling helpers, and a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import kmock
import kopf
from kube_emulator import FIXTURE_AGENT, ApiServer, Cluster
from kubernetes.aio.client import Configuration

from rhymerl.api.spec import API_VERSION, KIND, RLJob
from rhymerl.api.spelling import camel_keys
from rhymerl.operator.reconcile.handlers import Operator
from rhymerl.operator.reconcile.run import serve, settings

NAMESPACES = ["team-a", "team-b"]
WRITES = {"POST", "PATCH", "PUT", "DELETE"}
T = TypeVar("T")


async def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.02)


def quick_settings() -> kopf.OperatorSettings:
    """The operator's kopf settings, with the waits of a graceful stop cut short."""
    out = settings()
    out.queueing.exit_timeout = 0.1
    out.queueing.idle_timeout = 0.5
    return out


class RunningOperator:
    """An operator running in its own thread and event loop; `call` runs one of its coroutines there."""

    def __init__(self, op: Operator, loop: asyncio.AbstractEventLoop) -> None:
        self.op = op
        self.loop = loop

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        async def run() -> T:
            return await fn()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self.loop))

    async def idle(self) -> None:
        await self.call(self.op.idle)

    async def resync(self) -> None:
        """One pass of every job, as the periodic resync does, and wait for them."""
        await self.call(self.op.resync_once)
        await self.idle()


class Kube:
    """The cluster of one test and the operators started against it."""

    def __init__(self, server: ApiServer, cluster: Cluster) -> None:
        self.server = server
        self.cluster = cluster
        self.running: RunningOperator | None = None

    def operator_writes(self) -> list[str]:
        """Every write the operator (and kopf) made so far, as 'METHOD path'."""
        return [f"{r.method.value} {r.url.path}" for r in list(self.server._requests)
                if r.method.value in WRITES and r.headers.get("User-Agent") != FIXTURE_AGENT]

    @contextlib.asynccontextmanager
    async def operator(self, health_port: int | None = None, metrics_port: int | None = None
                       ) -> AsyncIterator[RunningOperator]:
        """Run the operator (`rhymerl operator`: kopf and the real API client) against this cluster until the
        block ends. It runs in a thread with its own event loop, as a separate process would: the API
        server keeps this loop, and the operator's stop does not wait on the server's connections."""
        url = str(self.server.url).rstrip("/")
        registry = kopf.OperatorRegistry()

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=url, insecure=True)

        started: list[Operator] = []
        ready = threading.Event()
        holder: dict[str, Any] = {}

        async def main() -> None:
            holder["loop"] = asyncio.get_running_loop()
            holder["stop"] = stop = asyncio.Event()
            flag = asyncio.Event()
            waiter = asyncio.create_task(flag.wait())
            waiter.add_done_callback(lambda _: ready.set())
            await serve(NAMESPACES, metrics_port=metrics_port, health_port=health_port, resync_s=3600,
                        configuration=Configuration(host=url), registry=registry, stop_flag=stop, ready_flag=flag,
                        on_start=started.append, kopf_settings=quick_settings())

        thread = threading.Thread(target=asyncio.run, args=(main(),), name="operator", daemon=True)
        thread.start()
        await eventually(ready.is_set, 10, "the operator to start")
        running = RunningOperator(started[0], holder["loop"])
        self.running = running
        try:
            yield running
        finally:
            holder["loop"].call_soon_threadsafe(holder["stop"].set)
            await eventually(lambda: not thread.is_alive(), 15, "the operator to stop")
            self.running = None

    async def settle(self, timeout: float = 15.0) -> None:
        """Let the operator and the cluster's controllers act until neither has anything left to do."""
        running = self.running
        assert running is not None
        deadline = time.monotonic() + timeout
        quiet = 0
        while quiet < 3:
            if time.monotonic() > deadline:
                raise AssertionError("the operator and the cluster did not settle")
            passes = running.op.passes
            changed = await self.cluster.step()
            await asyncio.sleep(0.05)  # watch events reach kopf, which wakes the operator
            await running.idle()
            quiet = quiet + 1 if not changed and running.op.passes == passes else 0

    async def create_job(self, namespace: str, name: str, spec: dict[str, Any] | None = None,
                         respell: bool = True) -> dict[str, Any]:
        """Create an RLJob; `respell`: with its fields camelCase, as the installed CRD names them (the API
        server would prune a snake_case key, as kubectl's field validation would refuse it)."""
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": namespace},
                "spec": spec or {}}
        if respell:
            body = camel_keys(RLJob, body)
        created: dict[str, Any] = await self.cluster.request(
            "POST", f"/apis/rhymerl.io/v1alpha1/namespaces/{namespace}/rljobs", body)
        return created

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The RLJob as a read returns it (defaulted by the installed CRD), None when it is gone."""
        found = self.server.current(kmock.resource("rhymerl.io/v1alpha1/rljobs"), namespace, name)
        return None if found is None else self.server.served("rljobs", found)

    def condition(self, namespace: str, name: str, type_: str) -> dict[str, Any]:
        job = self.job(namespace, name) or {}
        found = [c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == type_]
        return found[0] if found else {}

    def children(self, namespace: str, name: str) -> list[tuple[str, str]]:
        from rhymerl.operator.manifests.labels import INSTANCE_KEY

        return sorted((str(res.plural), n) for (res, ns, n), obj in list(self.server.objects.items())
                      if ns == namespace and not obj.deleted and res.plural not in ("pods", "events", "rljobs", "persistentvolumeclaims")
                      and (obj.raw["metadata"].get("labels") or {}).get(INSTANCE_KEY) == name)




