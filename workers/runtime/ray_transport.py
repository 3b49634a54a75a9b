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
from typing import Any

import ray
import ray.exceptions
import torch

from rhymerl.api import RLJob
from rhymerl.api.roles import Role
from rhymerl.errors import DiskFull, RunFailed, UserError, disk_full, is_disk_full, plain
from rhymerl.workers.controller.fleet import WorkerLost
from rhymerl.workers.controller.loop import Backend, run_steps
from rhymerl.workers.controller.scale import ScaleFile
from rhymerl.workers.controller.transport import Report, ResultLost, Stream, WorkerGone
from rhymerl.workers.roles.rollout_worker import RolloutWorker
from rhymerl.workers.roles.train_worker import TrainWorker
from rhymerl.workers.run_folder.run_dir import RunDir
from rhymerl.workers.run_folder.step_metrics import StepMetrics
from rhymerl.workers.runtime.cluster import local_ray, role_capacity, role_gpus, spawn
from rhymerl.workers.runtime.ray_draft_link import RayDraftLink

START_TIMEOUT_S = 600.0  # a restarted worker's start-up (loading the model, measuring the verify cost)


class RayTransport:
    concurrent = True

    def __init__(self, gpus: Mapping[Role, float] | None = None) -> None:
        """gpus: what one worker of each role reserves (cluster.role_gpus; none unless said)."""
        self._pings: dict[int, Any] = {}
        self.gpus = dict(gpus or {})

    def start(self, role: Role, cls: type, *args: Any, lead: bool = False) -> Any:
        actor = spawn(cls, role, *args, gpus=self.gpus.get(role, 0.0), lead=lead)
        self._pings[id(actor)] = actor.ping.remote()
        return actor

    def ready(self, handle: Any) -> bool:
        ref = self._pings.get(id(handle))
        if ref is None:
            return True
        if not ray.wait([ref], timeout=0)[0]:
            return False
        del self._pings[id(handle)]
        self.get(ref)
        return True

    def stop(self, handle: Any) -> None:
        self._pings.pop(id(handle), None)
        with contextlib.suppress(ray.exceptions.RayError, ValueError):
            ray.kill(handle, no_restart=True)

    def call(self, handle: Any, method: str, *args: Any, returns: int = 1) -> Any:
        options: dict[str, Any] = {"num_returns": returns}
        if method in RolloutWorker.CONTROL:
            options["concurrency_group"] = "control"
        elif method in RolloutWorker.WEIGHTS | TrainWorker.WEIGHTS:
            options["concurrency_group"] = "weights"
        elif method in RolloutWorker.DRAFTS:
            options["concurrency_group"] = "drafts"
        refs = getattr(handle, method).options(**options).remote(*args)
        return tuple(refs) if returns > 1 else refs

    def tell(self, handle: Any, method: str, *args: Any) -> None:
        self.call(handle, method, *args)

    def draft_link(self, drafter: Any, link: Hashable) -> RayDraftLink:
        return RayDraftLink(drafter, link)

    def get(self, result: Any, timeout: float | None = None) -> Any:
        try:
            with _worker_errors():
                return ray.get(result, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"no answer within {timeout}s") from None

    def done(self, result: Any) -> bool:
        return bool(ray.wait([result], timeout=0)[0])

    def wait_alive(self, handle: Any) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                ray.get(handle.ping.remote(), timeout=max(1.0, deadline - time.monotonic()))
                return
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    raise WorkerGone(f"a worker did not come back within {START_TIMEOUT_S:.0f}s") from None
                time.sleep(0.2)
            except ray.exceptions.RayActorError as exc:
                raise WorkerGone(why(exc)) from exc

    def stream(self, handle: Any, call_id: int, *args: Any) -> Stream:
        gen = handle.generate.options(num_returns="streaming").remote(*args)
        return Stream(handle, call_id, (gen, iter(gen)))

    def next_report(self, streams: Sequence[Stream], timeout: float) -> Report | None:
        if not streams:
            time.sleep(min(timeout, 0.2))
            return None
        by_gen = {id(s.source[0]): s for s in streams}
        ready, _ = ray.wait([s.source[0] for s in streams], num_returns=1, timeout=timeout)
        if not ready:
            return None
        stream = by_gen[id(ready[0])]
        items: Iterator[Any] = stream.source[1]
        with _worker_errors(stream):
            item = next(items, None)
            if item is None:
                raise WorkerGone(stream, "the rollout stream ended without its output")
            tag = next(items, None)
            if tag is None:
                ray.get(item)  # the call's error, if it raised one
                raise WorkerGone(stream, "the rollout stream ended early")
            kind, value = ray.get(tag)
        if kind == "output":
            stream.source = None  # nothing more comes: the stream's references go
        return Report(stream, str(kind), value, item)

    def keep(self, item: Any) -> Any:
        return ray.put(ray.get(item))

    def deferred(self, result: Any) -> Any:
        return _Deferred(result)

    def clock(self, handle: Any) -> float:
        return time.monotonic()

    def catch_up(self, handle: Any, to: Any) -> None:
        """Workers run beside each other on real clocks: nothing to catch up."""

    def sync(self, handles: Sequence[Any]) -> float:
        return time.monotonic()

    def capacity(self, role: Role) -> int | None:
        """The units of the role's resource in the cluster: one per pod of the role that joined."""
        return role_capacity()[role]


class _Deferred:
    """An object reference a worker resolves only if it needs it (Ray resolves a reference passed
    as an argument before the call, this one it leaves alone)."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def get(self) -> Any:
        return ray.get(self.ref)




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


INFRASTRUCTURE = (WorkerGone, ResultLost, WorkerLost, ray.exceptions.RayActorError, ray.exceptions.RaySystemError,
                  ray.exceptions.LocalRayletDiedError, ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError,
                  ray.exceptions.ObjectLostError, ray.exceptions.OutOfMemoryError, ray.exceptions.RpcError)
_ROLE_OF_CLASS = {"TrainWorker": "the train worker", "RolloutWorker": "a rollout worker",
                  "RewardWorker": "a reward worker", "HistoryWorker": "the history worker"}


def run_failure(exc: BaseException, where: str) -> UserError | None:
    """The one-line error a user sees for what ended a run on Ray, None for what stays itself (a
    bug's traceback, a stop): a worker's UserError as it was raised; a full disk, wherever it was
    met, DiskFull; a worker, node or object lost for good (the train worker's weights die with it,
    a worker's restarts or a call's re-runs are used up, the raylet died) RunFailed."""
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
        return RunFailed(f"{lost(exc)}; the run cannot go on without it")
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
