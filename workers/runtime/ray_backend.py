"""The job's steps on Ray (`backend: ray` on this machine, the controller pod of a cluster): the step
loop over RayTransport, and what ended a run there as the one line a user sees. Kept out of
ray_transport.py, which the role workers' actors unpickle (a handle in their arguments) and so
must not load the step loop or torch."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator

import ray
import ray.exceptions
import torch

from rhymerl.api import RLJob
from rhymerl.errors import DiskFull, RunFailed, UserError, disk_full, is_disk_full, plain
from rhymerl.workers.controller.fleet import WorkerLost
from rhymerl.workers.controller.loop import Backend, run_steps
from rhymerl.workers.controller.scale import ScaleFile
from rhymerl.workers.controller.transport import ResultLost, WorkerGone
from rhymerl.workers.run_folder.run_dir import RunDir
from rhymerl.workers.run_folder.step_metrics import StepMetrics
from rhymerl.workers.runtime.cluster import local_ray, role_gpus
from rhymerl.workers.runtime.ray_transport import RayTransport, why


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
