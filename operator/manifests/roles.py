"""What each role's process is: its command, environment, ports and health endpoints.

The one place the operator (pod templates) and the "pods as processes" tests read them from; the
pods run `rhymerl worker` (the distributed runtime). Plain data: pods.py and containers.py turn it into
Kubernetes shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rhymerl.api.roles import Role
from rhymerl.workers.run_folder.identity import JOB_UID_ENV, RESUME_ANNOTATION, RESUME_FROM_ENV
from rhymerl.workers.runtime.ray_network import AUTH_MODE_ENV, POD_PORTS, TOKEN_PATH, TOKEN_PATH_ENV

SPEC_DIR = "/etc/rhymerl"
SPEC_FILE = "spec.yaml"
SPEC_PATH = f"{SPEC_DIR}/{SPEC_FILE}"
DATA_DIR = "/var/lib/rhymerl"  # run folder and checkpoints; a volume claim on stateful roles
SCRATCH_DIR = "/tmp"  # the only other writable path: root filesystems are read-only
HTTP_PORT = 9090  # every worker: /metrics, /healthz (alive), /readyz (ready to take work)
HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
RAY_GCS_PORT = 6379  # the controller pod is the Ray head; its other Ray ports: ray_network.POD_PORTS
# Environment the pod's own identity fills in (downward API in a cluster, the launcher elsewhere).
FIELD_ENV: dict[str, str] = {
    "RHYMERL_POD_NAME": "metadata.name",
    "RHYMERL_NAMESPACE": "metadata.namespace",
    "RHYMERL_POD_IP": "status.podIP",
}


@dataclass(frozen=True)
class Port:
    name: str
    port: int


@dataclass(frozen=True)
class RoleRuntime:
    """How one role runs, apart from anything the spec decides (images, replicas, resources)."""

    role: Role
    ports: tuple[Port, ...]
    stateful: bool  # keeps checkpoints on a volume claim that outlives its pods
    kube_api: bool  # talks to the Kubernetes API (patches its job's status.progress)
    history_client: bool  # reads or writes the history store (gets the Redis password, if any)
    startup_s: int  # how long start-up (loading a model) may take before liveness applies
    stop_grace_s: int = 30  # SIGTERM to SIGKILL: the controller finishes its step and checkpoints in it, a
    # rollout pod's workers hand their samples back


_HTTP = Port("http", HTTP_PORT)
# Every pod's Ray node (worker processes aside: a range, which a container port cannot name); the head
# adds the GCS and the Ray client server.
_NODE = tuple(Port(n, p) for n, p in POD_PORTS.named().items() if n != "ray-client")
_HEAD = (Port("ray-gcs", RAY_GCS_PORT), Port("ray-client", POD_PORTS.named()["ray-client"]))
GRACE_ENV = "RHYMERL_GRACE_S"
RUNTIME: dict[Role, RoleRuntime] = {
    "controller": RoleRuntime("controller", (_HTTP, *_HEAD, *_NODE),
                              stateful=True, kube_api=True, history_client=True, startup_s=300, stop_grace_s=900),
    "rollout": RoleRuntime("rollout", (_HTTP, *_NODE), stateful=False, kube_api=False, history_client=True,
                           startup_s=1200, stop_grace_s=60),
    "train": RoleRuntime("train", (_HTTP, *_NODE), stateful=True, kube_api=False, history_client=False,
                         startup_s=1200),
    "reward": RoleRuntime("reward", (_HTTP, *_NODE), stateful=False, kube_api=False, history_client=False,
                          startup_s=300),
    "history": RoleRuntime("history", (_HTTP, *_NODE), stateful=False, kube_api=False, history_client=True,
                           startup_s=300),
}


def child_name(job_name: str, suffix: str) -> str:
    """`<job>-<suffix>`: the name of a child object (a role, `spec`, ...) of one job."""
    return f"{job_name}-{suffix}"


def controller_address(job_name: str) -> str:
    """host:port of the Ray head: pod 0 of the controller StatefulSet, through its headless Service
    (a short name: it resolves inside the job's namespace)."""
    service = child_name(job_name, "controller")
    return f"{service}-0.{service}:{RAY_GCS_PORT}"


def argv(role: Role) -> list[str]:
    """The process of one role; the image's entrypoint is the same `rhymerl` console script."""
    return ["rhymerl", "worker", "--role", role, "--spec", SPEC_PATH]


FETCH_DIR = f"{DATA_DIR}/fetched"  # model and data fetched by a pod's fetch step (rhymerl.api.sources)
FETCH_CONTAINER = "fetch"
READS_MODEL: tuple[Role, ...] = ("controller", "rollout", "train")  # every role reads the data


def fetch_argv(model: str | None, data: str | None, model_cache: str | None = None) -> list[str]:
    """The fetch step of a pod (an init container, in the role's image): the sources it fetches, the model
    onto the cache claim mounted at `model_cache` when the job has one."""
    out = ["rhymerl", "fetch", "--into", FETCH_DIR]
    if model is not None:
        out += ["--model", model]
        if model_cache is not None:
            out += ["--model-cache", model_cache]
    if data is not None:
        out += ["--data", data]
    return out


def environment(job_name: str, role: Role) -> dict[str, str]:
    """Environment every pod of `role` gets besides FIELD_ENV (and the Redis password, when set)."""
    return {
        "RHYMERL_JOB": job_name,
        "RHYMERL_ROLE": role,
        "RHYMERL_SPEC": SPEC_PATH,
        "RHYMERL_DATA_DIR": DATA_DIR,
        "RHYMERL_CONTROLLER": controller_address(job_name),
        "RHYMERL_HTTP_PORT": str(HTTP_PORT),
        "HOME": SCRATCH_DIR,  # caches (torch, vLLM, Hugging Face) need a writable home
        "PYTHONUNBUFFERED": "1",
        GRACE_ENV: str(RUNTIME[role].stop_grace_s),  # a pod cannot read its own grace period otherwise
        AUTH_MODE_ENV: "token",  # Ray refuses any peer or client without the job's token
        TOKEN_PATH_ENV: TOKEN_PATH,  # the job's Secret, mounted (access.py)
    }


def identity_env(uid: str, annotations: Mapping[str, str]) -> list[dict[str, str]]:
    """The RLJob's uid, and the earlier job's uid it asks to go on from (its RESUME_ANNOTATION), for its
    pods' run folders (workers/run_folder/identity.py): a job re-created under the same name starts fresh."""
    named = {JOB_UID_ENV: uid, **({RESUME_FROM_ENV: annotations[RESUME_ANNOTATION]}
                                   if annotations.get(RESUME_ANNOTATION) else {})}
    return [{"name": k, "value": v} for k, v in named.items()]
