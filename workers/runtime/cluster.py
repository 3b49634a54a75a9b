"""Ray under the distributed runtime: joining or starting a cluster, and placing role workers.

Each pod joins the controller's Ray head advertising its role as a custom resource
(`rhymerl_<role>: 1`), and each role worker asks for one unit of its role's resource (and no CPU:
the pod's CPU limit is what bounds it), so the worker of a rollout pod lands on that pod and
nowhere else. A local run starts a private Ray instance on this machine that advertises every
role, so the same placement code runs unchanged.

Reward workers are restarted by Ray when their process dies, as often as it takes, without retrying
the call that was running: the step loop runs it again (the fleet bounds how often one call may lose
its worker). A history worker is not: the step loop starts another and refills it from the train
worker's dumps (controller/history_client.py), as a restart would need to be. Rollout workers are
not restarted in place: the rollout fleet replaces a lost one where there is room and resumes its
samples elsewhere (workers/controller/fleet.py). The train worker is not restarted: its weights and optimiser die
with it, and the run resumes from its last checkpoint.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray

from rhymerl.api import RLJob
from rhymerl.api.roles import ROLES, Role
from rhymerl.workers import faults
from rhymerl.workers.controller.stopping import held_signals, reassert_handlers
from rhymerl.workers.runtime.reaper import Reaper

NAMESPACE = "rhymerl"
RESTARTS: dict[Role, int] = {"rollout": 0, "train": 0, "reward": -1, "history": 0, "controller": -1}  # -1: always
LOCAL_ROLE_UNITS = 1024  # a local instance hosts any number of each role's workers
NO_IDLE_WORKERS = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
"""Ray's settings that keep a node from starting idle worker processes in advance (one per CPU as the
first driver connects, each importing Ray: about a CPU-second and 100 MB apiece): they would serve
plain tasks, and a run starts only actors, each in a process of its own. `ray_config_env` passes
them to `ray start` (node.py), `_system_config` to a local instance."""


def ray_config_env(config: dict[str, bool]) -> dict[str, str]:
    """Ray's settings as the environment of the processes that read them (`RAY_<name>`)."""
    return {f"RAY_{name}": str(value).lower() for name, value in config.items()}


def role_resource(role: Role) -> str:
    return f"rhymerl_{role}"


def lead_resource(role: Role) -> str:
    """Held by the one pod of a role whose worker must run there: the train pod of ordinal 0, whose
    data volume holds the run's checkpoints (its rank 0 writes and reads them)."""
    return f"rhymerl_{role}_lead"


def role_resources(role: Role, units: int = 1, lead: bool = False) -> dict[str, float]:
    """What a pod of `role` advertises when it joins (`ray start --resources`): `units` workers of it,
    and the role's lead resource on the lead pod."""
    return {role_resource(role): float(units), **({lead_resource(role): 1.0} if lead else {})}


def role_gpus(job: RLJob) -> dict[Role, float]:
    """GPUs one worker of each role reserves: a train rank one of its pod's (when the pods have
    GPUs), a rollout worker its replica's tensor-parallel GPUs, the others none."""
    spec = job.spec
    return {"controller": 0.0, "reward": 0.0, "history": 0.0, "train": 1.0 if spec.train.resources.gpu else 0.0,
            "rollout": float(spec.rollout.gpus_per_replica)}


@contextmanager
def local_ray(job_name: str) -> Iterator[None]:
    """A private Ray instance on this machine for one run, shut down after it (unless the caller
    already had one: then it is used and left running). Every Ray process it started is gone when
    it returns, and dies with this process if this process is killed (reaper.py). SIGTERM and
    Ctrl-C during Ray's start-up are acted on once it has started (so it can be stopped whole),
    by this process's own handlers: Ray's are never installed."""
    if ray.is_initialized():
        yield
        return
    units = {role_resource(r): float(LOCAL_ROLE_UNITS) for r in ROLES} | \
        {lead_resource(r): float(LOCAL_ROLE_UNITS) for r in ROLES}
    reaper = Reaper()
    reaper.start()
    try:
        with held_signals():
            with ray_leaves_signals_alone():
                ray.init(address="local", num_cpus=os.cpu_count() or 1, resources=units,
                         namespace=NAMESPACE, include_dashboard=False, configure_logging=False, log_to_driver=True,
                         runtime_env={"env_vars": {"RHYMERL_JOB": job_name}}, _system_config=NO_IDLE_WORKERS)
            reaper.look()  # the agents the raylet started, which its death would orphan
            faults.point("ray-start", 0)
        yield
    finally:
        try:
            with held_signals():  # stopped whole, even on a second signal
                try:
                    if ray.is_initialized():
                        ray.shutdown()
                finally:
                    reaper.stop()
        finally:
            reassert_handlers()


@contextmanager
def ray_leaves_signals_alone() -> Iterator[None]:
    """Inside, ray.init installs no signal handler in this process: not its Python SIGTERM handler
    (which exits at once, skipping our cleanup), not the C++ failure handler it adds for SIGTERM in
    a driver (which prints a stack trace and aborts with SIGABRT if the process is still alive 3 s
    later, and resets SIGTERM to the default action at shutdown). Ray's stack traces on a crash
    stay in its own processes. Both are private to Ray: where a version lacks them, nothing is
    changed (held_signals still puts our handlers back after the start)."""
    constants = importlib.import_module("ray._private.ray_constants")
    if hasattr(constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"):
        vars(constants)["RAY_DISABLE_FAILURE_SIGNAL_HANDLER"] = True  # read as the driver's core worker starts
    utils = vars(importlib.import_module("ray._private.utils"))
    install = utils.get("set_sigterm_handler")
    if install is None:
        yield
        return
    utils["set_sigterm_handler"] = lambda handler: None
    try:
        yield
    finally:
        utils["set_sigterm_handler"] = install


def spawn(cls: type, role: Role, *args: Any, gpus: float = 0.0, lead: bool = False) -> Any:
    """Start one worker of `role` (a `cls` actor) where that role's resource is (with `lead`: on the
    role's lead pod), with `gpus` GPUs of that pod (Ray sets its CUDA_VISIBLE_DEVICES to them)."""
    groups = getattr(cls, "CONCURRENCY_GROUPS", None)  # methods that run beside the ordered ones
    remote: Any = ray.remote(concurrency_groups=groups)(cls) if groups else ray.remote(cls)  # type: ignore[call-overload]
    resources = {role_resource(role): 1.0, **({lead_resource(role): 1.0} if lead else {})}
    actor: Any = remote.options(num_cpus=0, num_gpus=gpus, resources=resources,
                                max_restarts=RESTARTS[role], max_task_retries=0, max_concurrency=1)
    return actor.remote(*args)


def role_capacity() -> dict[Role, int]:
    """How many workers of each role the cluster has room for (pods joined so far)."""
    have: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return {r: int(have.get(role_resource(r), 0)) for r in ROLES}
