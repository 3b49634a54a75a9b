"""The step loop's role workers as Ray actors (the Transport of workers/controller/transport.py):
`backend: ray` on this machine, and the pods of a cluster.

A call returns Ray references and bulk data moves between workers by reference; a rollout call is
a streaming actor method whose items the step loop keeps by reference, reading only the small tag
after each. Clocks are the wall clock. A worker that died shows as `WorkerGone` (Ray restarts
reward and history workers, the fleet replaces rollout workers, a lost train worker stops the
run: its weights died with it, the run resumes from its last checkpoint), an object that died with
its node as `ResultLost`.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import ray
import ray.exceptions

from rhymerl.api.roles import Role
from rhymerl.errors import plain
from rhymerl.workers.controller.role_apis import (
    RolloutAPI,
    Weights,
    WeightsRef,
    concurrency_group,
)
from rhymerl.workers.controller.transport import (
    Handle,
    Indexes,
    Items,
    OutputReport,
    Report,
    Result,
    ResultLost,
    Stream,
    WorkerGone,
    report_of,
)
from rhymerl.workers.roles.samples import RolloutCall, RolloutProgress
from rhymerl.workers.runtime.cluster import role_capacity, spawn
from rhymerl.workers.runtime.ray_draft_link import RayDraftLink

START_TIMEOUT_S = 600.0  # a restarted worker's start-up (loading the model, measuring the verify cost)

P = ParamSpec("P")
A = TypeVar("A")
W = TypeVar("W")
R = TypeVar("R")
R1 = TypeVar("R1")
R2 = TypeVar("R2")


@dataclass(eq=False)
class _Actor(Handle[A]):
    actor: Any  # Ray's ActorHandle: its methods are made at run time


@dataclass(eq=False)
class _Ref(Result[R]):
    ref: ray.ObjectRef[object]


@dataclass(eq=False)
class _RayStream(Stream):
    gen: ray.ObjectRefGenerator | None = None
    items: Iterator[ray.ObjectRef[object]] | None = None


def _referred(ref: ray.ObjectRef[object]) -> Items:
    """A stream's item as its tag says it is, by reference: the step loop fetches only what it reads."""
    def item(kind: type[R]) -> Result[R]:
        return _Ref(ref)
    return item


def _actor(handle: Handle[object]) -> Any:
    if not isinstance(handle, _Actor):
        raise TypeError(f"not a handle of RayTransport: {handle!r}")
    return handle.actor


def _ref(result: Result[object]) -> ray.ObjectRef[object]:
    if not isinstance(result, _Ref):
        raise TypeError(f"not a result of RayTransport: {result!r}")
    return result.ref


class RayTransport:
    concurrent = True

    def __init__(self, gpus: Mapping[Role, float] | None = None) -> None:
        """gpus: what one worker of each role reserves (cluster.role_gpus; none unless said)."""
        self._pings: dict[int, Any] = {}
        self.gpus = dict(gpus or {})

    def start(self, role: Role, cls: Callable[P, W], *args: P.args, **kwargs: P.kwargs) -> Handle[W]:
        return self._start(role, cls, args, kwargs, lead=False)

    def start_lead(self, role: Role, cls: Callable[P, W], *args: P.args, **kwargs: P.kwargs) -> Handle[W]:
        return self._start(role, cls, args, kwargs, lead=True)

    def _start(self, role: Role, cls: Callable[..., W], args: tuple[object, ...], kwargs: Mapping[str, object],
               lead: bool) -> Handle[W]:
        if kwargs or not isinstance(cls, type):
            raise TypeError(f"a {role} worker on Ray: a class, with its arguments by position")
        actor = spawn(cls, role, *args, gpus=self.gpus.get(role, 0.0), lead=lead)
        self._pings[id(actor)] = actor.ping.remote()
        return _Actor(actor)

    def ready(self, handle: Handle[object]) -> bool:
        actor = _actor(handle)
        ref = self._pings.get(id(actor))
        if ref is None:
            return True
        if not ray.wait([ref], timeout=0)[0]:
            return False
        del self._pings[id(actor)]
        self.get(_Ref(ref))
        return True

    def stop(self, handle: Handle[object]) -> None:
        actor = _actor(handle)
        self._pings.pop(id(actor), None)
        with contextlib.suppress(ray.exceptions.RayError, ValueError):
            ray.kill(actor, no_restart=True)

    def _remote(self, handle: Handle[object], method: Callable[..., object], returns: int, args: tuple[object, ...],
                kwargs: Mapping[str, object]) -> Any:
        options: dict[str, Any] = {"num_returns": returns}
        group = concurrency_group(method)
        if group is not None:
            options["concurrency_group"] = group
        return getattr(_actor(handle), method.__name__).options(**options).remote(*args, **kwargs)

    def call(self, handle: Handle[A], method: Callable[Concatenate[A, P], R], *args: P.args,
             **kwargs: P.kwargs) -> Result[R]:
        return _Ref(self._remote(handle, method, 1, args, kwargs))

    def call2(self, handle: Handle[A], method: Callable[Concatenate[A, P], tuple[R1, R2]], *args: P.args,
              **kwargs: P.kwargs) -> tuple[Result[R1], Result[R2]]:
        first, second = self._remote(handle, method, 2, args, kwargs)
        return _Ref(first), _Ref(second)

    def tell(self, handle: Handle[A], method: Callable[Concatenate[A, P], object], *args: P.args,
             **kwargs: P.kwargs) -> None:
        self._remote(handle, method, 1, args, kwargs)

    def draft_link(self, drafter: Handle[RolloutAPI], link: Hashable) -> RayDraftLink:
        return RayDraftLink(_actor(drafter), link)

    def get(self, result: Result[R], timeout: float | None = None) -> R:
        try:
            with _worker_errors():
                return cast(R, ray.get(_ref(result), timeout=timeout))
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"no answer within {timeout}s") from None

    def done(self, result: Result[object]) -> bool:
        return bool(ray.wait([_ref(result)], timeout=0)[0])

    def arg(self, value: R | Result[R]) -> R:
        """A reference given as an argument: Ray resolves it before the call runs, so the worker gets an R."""
        return cast(R, _ref(value)) if isinstance(value, Result) else value

    def wait_alive(self, handle: Handle[object]) -> None:
        actor = _actor(handle)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                ray.get(actor.ping.remote(), timeout=max(1.0, deadline - time.monotonic()))
                return
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    raise WorkerGone(f"a worker did not come back within {START_TIMEOUT_S:.0f}s") from None
                time.sleep(0.2)
            except ray.exceptions.RayActorError as exc:
                raise WorkerGone(why(exc)) from exc

    def stream(self, handle: Handle[RolloutAPI], call_id: int, call: RolloutCall,
               indexes: Indexes | Result[Indexes] | None, resume: RolloutProgress | Result[RolloutProgress] | None,
               ) -> Stream:
        generate = getattr(_actor(handle), RolloutAPI.generate.__name__)
        gen = generate.options(num_returns="streaming").remote(call, self.arg(indexes), self.arg(resume))
        return _RayStream(handle, call_id, gen=gen, items=iter(gen))

    def next_report(self, streams: Sequence[Stream], timeout: float) -> Report | None:
        if not streams:
            time.sleep(min(timeout, 0.2))
            return None
        open_ = [s for s in streams if isinstance(s, _RayStream) and s.gen is not None]
        by_gen = {id(s.gen): s for s in open_}
        ready, _ = ray.wait([s.gen for s in open_], num_returns=1, timeout=timeout)
        if not ready:
            return None
        stream = by_gen[id(ready[0])]
        assert stream.items is not None
        with _worker_errors(stream):
            item = next(stream.items, None)
            if item is None:
                raise WorkerGone(stream, "the rollout stream ended without its output")
            tag = next(stream.items, None)
            if tag is None:
                ray.get(item)  # the call's error, if it raised one
                raise WorkerGone(stream, "the rollout stream ended early")
            report = report_of(stream, ray.get(tag), _referred(item))
        if isinstance(report, OutputReport):
            stream.gen = stream.items = None  # nothing more comes: the stream's references go
        return report

    def keep(self, item: Result[R]) -> Result[R]:
        return _Ref(ray.put(ray.get(_ref(item))))

    def deferred(self, weights: Weights | Result[Weights]) -> Weights | WeightsRef:
        return _Deferred(_ref(weights)) if isinstance(weights, Result) else weights

    def clock(self, handle: Handle[object]) -> float:
        return time.monotonic()

    def catch_up(self, handle: Handle[object], to: Handle[object]) -> None:
        """Workers run beside each other on real clocks: nothing to catch up."""

    def sync(self, handles: Sequence[Handle[object]]) -> float:
        return time.monotonic()

    def capacity(self, role: Role) -> int | None:
        """The units of the role's resource in the cluster: one per pod of the role that joined."""
        return role_capacity()[role]


class _Deferred:
    """An object reference a worker resolves only if it needs it (Ray resolves a reference passed
    as an argument before the call, this one it leaves alone)."""

    def __init__(self, ref: ray.ObjectRef[object]) -> None:
        self.ref = ref

    def get(self) -> Weights:
        return cast(Weights, ray.get(self.ref))


@contextlib.contextmanager
def _worker_errors(*about: Any) -> Iterator[None]:
    """Ray's errors as the transport's: a dead worker WorkerGone, a lost object ResultLost (each
    with `about` first in its args), a worker's own error raised as itself."""
    try:
        yield
    except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as exc:
        raise WorkerGone(*about, why(exc)) from exc
    except ray.exceptions.ObjectLostError as exc:
        raise ResultLost(*about, why(exc)) from exc
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, ray.exceptions.ObjectLostError):
            raise ResultLost(*about, why(exc)) from exc
        raise exc.as_instanceof_cause() from None  # type: ignore[no-untyped-call]


def why(exc: BaseException) -> str:
    """One line on what went wrong in a worker: the error it raised, not Ray's wrapping of it."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
        return plain(f"{type(cause).__name__}: {cause}").splitlines()[0]
    lines = [ln.strip() for ln in plain(str(exc)).splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", ln)]
    return (errors[-1] if errors else lines[0] if lines else type(exc).__name__)[:300]
