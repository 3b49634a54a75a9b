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
import importlib
import re
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import ray
import ray.exceptions
import torch

from rhymerl.api import RLJob
from rhymerl.api.roles import Role
from rhymerl.errors import DiskFull, RunFailed, UserError, disk_full, is_disk_full, plain
from rhymerl.workers.controller.fleet import WorkerLost
from rhymerl.workers.controller.loop import Backend, run_steps
from rhymerl.workers.controller.role_apis import (
    RolloutAPI,
    Weights,
    WeightsRef,
    concurrency_group,
)
from rhymerl.workers.controller.scale import ScaleFile
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
from rhymerl.workers.run_folder.run_dir import RunDir
from rhymerl.workers.run_folder.step_metrics import StepMetrics
from rhymerl.workers.runtime.cluster import local_ray, role_capacity, role_gpus, spawn
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


def run_steps_local_ray(job: RLJob, run: RunDir, resume: bool) -> Iterator[StepMetrics]:
    """The job's steps on a private Ray instance on this machine, the workers computing with as
    many threads as this process (so their arithmetic, and the tokens, are the in-process run's);
    `rhymerl scale` sets how many rollout workers."""
    with local_ray(job.metadata.name):
        yield from run_steps_ray(job, run, resume, torch.get_num_threads(), str(run.path), ScaleFile(run.path, job))


def run_steps_ray(job: RLJob, run: RunDir, resume: bool, threads: int | None, train_run: str | None,
                  wanted: Callable[[], int], say: Callable[[str], None] = lambda message: None,
                  in_use: Callable[[int | None], None] = lambda pods: None) -> Iterator[StepMetrics]:
    """The job's steps on Ray workers (cluster.local_ray or a joined cluster must be up).
    threads: every worker's torch threads (None: each its own pod's CPU limit). train_run: the run
    folder the train worker writes dumps and checkpoints into (one machine); None: the run folder
    on its own pod's data volume. in_use: told how many leading rollout pod ordinals hold workers."""
    backend = Backend(RayTransport(role_gpus(job)), threads, train_run, wanted, notice=True, say=say, in_use=in_use)
    try:
        yield from run_steps(job, run, resume, backend)
    except BaseException as exc:
        failure = run_failure(exc, str(run.path))
        if failure is None:
            raise
        raise failure from None


# A worker, node or object of another pod lost (its pod evicted, drained, preempted, OOM-killed...)
MEMBER_LOSSES = (WorkerGone, ResultLost, WorkerLost, ray.exceptions.RayActorError, ray.exceptions.NodeDiedError,
                 ray.exceptions.WorkerCrashedError, ray.exceptions.ObjectLostError, ray.exceptions.OutOfMemoryError)
# The driver's own link to Ray (its raylet, the GCS on its own head) failed
OWN_LOSSES = (ray.exceptions.RaySystemError, ray.exceptions.LocalRayletDiedError, ray.exceptions.RpcError)
INFRASTRUCTURE = MEMBER_LOSSES + OWN_LOSSES


class MemberLost(RunFailed):
    """A member of the run (a worker, node or object of another pod) was lost, not the driver's own
    Ray: exit 1 on one machine; a cluster's controller exits roles.MEMBER_LOST_EXIT_CODE (controller_pod.py),
    which the operator does not count as its crash."""
_ROLE_OF_CLASS = {"TrainWorker": "the train worker", "RolloutWorker": "a rollout worker",
                  "RewardWorker": "a reward worker", "HistoryWorker": "the history worker"}


def run_failure(exc: BaseException, where: str) -> UserError | None:
    """The one-line error a user sees for what ended a run on Ray, None for what stays itself (a
    bug's traceback, a stop): a worker's UserError as it was raised; a full disk, wherever it was
    met, DiskFull; a worker, node or object lost for good (the train worker's weights die with it,
    a worker's restarts or a call's re-runs are used up, the raylet died) RunFailed: MemberLost where
    what was lost belongs to another pod (MEMBER_LOSSES) and this machine's Ray processes are alive."""
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else None
    if isinstance(cause, UserError):  # a worker met the user's mistake: their one-line message
        return cause
    if isinstance(exc, DiskFull):
        return None
    if isinstance(exc, (Exception, ray.exceptions.RayError)) and is_disk_full(exc):
        return disk_full(where)
    if isinstance(exc, ray.exceptions.OutOfDiskError):
        return DiskFull(f"no space left for Ray's object store on this node: {why(exc)}")
    if isinstance(exc, INFRASTRUCTURE) or isinstance(cause, INFRASTRUCTURE):
        dead = dead_ray_processes()
        if dead:
            return RunFailed(f"lost this machine's Ray node: its {', '.join(dead)} died ({why(exc)}); the run cannot "
                             "go on without it")
        message = f"{lost(exc)}; the run cannot go on without it"
        member = isinstance(exc, MEMBER_LOSSES) or isinstance(cause, MEMBER_LOSSES)
        return MemberLost(message) if member else RunFailed(message)
    return None


def dead_ray_processes() -> list[str]:
    """The processes of the Ray instance this process started (local_ray) that died (raylet,
    gcs_server, ...): a worker's loss that is really its node's. Ray's own bookkeeping, private to
    it: nothing where it is missing, or where this process joined a cluster it did not start."""
    node = getattr(importlib.import_module("ray._private.worker"), "_global_node", None)
    try:
        return sorted({str(kind) for kind, _ in node.dead_processes()}) if node is not None else []
    except Exception:  # a Ray without this bookkeeping: say what the worker's error says
        return []


def lost(exc: BaseException) -> str:
    """What was lost, in a few words, with Ray's reason."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    text = " ".join(plain(str(c)) for c in chain)
    named = re.search(r"class_name: (\w+)", text)
    who = _ROLE_OF_CLASS.get(named.group(1), f"a {named.group(1)}") if named else None
    if who is None and isinstance(exc, WorkerLost):
        return f"the rollout fleet gave up: {exc}"
    if who is None and re.search(r"raylet|node (has )?died|NodeDied", text, re.IGNORECASE):
        who = "the Ray node (its raylet)"
    return f"lost {who or 'a Ray worker'} ({why(chain[-1])})"
