"""A pod's Ray node: the controller pod starts the head, every other pod joins it with its role.

Each is `ray start --block` run as a child process: the node lives exactly as long as that child.
When the head goes away (the controller pod restarted), a joined node's `ray start` exits; the
pod's process stays up and joins the next head when it answers (pod_supervisor.py), so a
controller restart restarts no other container: no restart counted, no image pulled again, no
CrashLoopBackOff delay.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import ray

from rhymerl.api import RLJob
from rhymerl.api.roles import ROLES, Role, train_ranks
from rhymerl.errors import UserError
from rhymerl.workers.controller.stopping import held_signals
from rhymerl.workers.runtime.cluster import (
    NAMESPACE,
    NO_IDLE_WORKERS,
    ray_config_env,
    ray_leaves_signals_alone,
    role_capacity,
    role_resources,
)
from rhymerl.workers.runtime.ray_network import POD_PORTS, SHARED_HOST_WORKER_PORTS, RayPorts, auth_env


class NodeError(UserError):
    """A Ray node that could not start or join."""


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


PORT_BASE_ENV = "RHYMERL_RAY_PORT_BASE"


def _ports(head: bool) -> list[str]:
    """Every port Ray opens, fixed (ray_network.py): a pod's from POD_PORTS, which the operator's
    NetworkPolicy names. Several nodes sharing one IP and one /tmp (pods as processes) each get a
    block of 64 from RHYMERL_RAY_PORT_BASE and a session folder (its socket files) named after it."""
    base_text = os.environ.get(PORT_BASE_ENV)
    if not base_text:
        return POD_PORTS.args(head)
    base = int(base_text)
    return [f"--temp-dir=/tmp/rhymerl-ray-{base}", *RayPorts(base, SHARED_HOST_WORKER_PORTS).args(head)]


def _start(args: list[str], log: Path, head: bool = False) -> subprocess.Popen[bytes]:
    """`ray start --block` with `args`, the fixed ports, token authentication when the pod has a
    token (ray_network.auth_env), and no idle workers started in advance (cluster.NO_IDLE_WORKERS)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    args = [*args, *_ports(head)]
    with log.open("ab") as out:
        return subprocess.Popen([_ray_cli(), "start", "--block", "--disable-usage-stats", *args],
                                stdout=out, stderr=subprocess.STDOUT,
                                env=os.environ | auth_env(os.environ) | ray_config_env(NO_IDLE_WORKERS))


def _ip() -> str:
    return os.environ.get("RHYMERL_POD_IP") or "127.0.0.1"


def start_head(port: int, role: Role, log: Path, object_store_bytes: int | None = None) -> subprocess.Popen[bytes]:
    args = ["--head", f"--port={port}", "--include-dashboard=false", f"--node-ip-address={_ip()}",
            f"--resources={json.dumps(role_resources(role))}"]
    if object_store_bytes:
        args.append(f"--object-store-memory={object_store_bytes}")
    return _start(args, log, head=True)


def join(address: str, role: Role, log: Path, object_store_bytes: int | None = None, units: int = 1,
         lead: bool = False) -> subprocess.Popen[bytes]:
    """Join the head as a pod of `role` hosting `units` of its workers (api/roles.py workers_per_pod), the
    role's lead pod if `lead` (cluster.lead_resource)."""
    args = [f"--address={address}", f"--node-ip-address={_ip()}",
            f"--resources={json.dumps(role_resources(role, units, lead))}"]
    if object_store_bytes:
        args.append(f"--object-store-memory={object_store_bytes}")
    return _start(args, log)


def stop(node: subprocess.Popen[bytes], timeout_s: float = 40.0) -> None:
    """Stop the node: on SIGTERM `ray start --block` drains it and stops every process it started."""
    if node.poll() is None:
        node.terminate()
        try:
            node.wait(timeout_s)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()


def reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def _log_tail(log: Path | None, lines: int = 3) -> str:
    if log is None:
        return ""
    try:
        return " / ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def wait_reachable(address: str, timeout_s: float, head: subprocess.Popen[bytes] | None = None,
                   head_log: Path | None = None) -> None:
    """Until the head's port accepts connections (the controller pod may start after this one);
    `head`: our own head process, whose exit ends the wait with its log's last lines."""
    deadline = time.monotonic() + timeout_s
    while True:
        if head is not None and head.poll() is not None:
            raise NodeError(f"the Ray head exited ({head.returncode}): {_log_tail(head_log)}")
        if reachable(address):
            return
        if time.monotonic() > deadline:
            raise NodeError(f"the Ray head at {address} is not reachable after {timeout_s:.0f}s")
        time.sleep(1.0)


def connect(address: str, timeout_s: float, head: subprocess.Popen[bytes] | None = None,
            head_log: Path | None = None) -> None:
    """Connect this process to the head at `address` as the driver of the steps; a SIGTERM meanwhile
    reaches this process's own handler once connected, as in cluster.local_ray.

    The head's GCS answers before its raylet has registered, and `ray.init` gives up on finding the
    raylet after Ray's GCS request timeout (60 s): on a loaded machine the head's raylet and agents can
    take longer to start. So with our own `head` still running and `timeout_s` not spent, a failed
    attempt is tried again; otherwise the error says what the head last logged."""
    deadline = time.monotonic() + timeout_s
    wait_reachable(address, timeout_s, head, head_log)
    os.environ.update(auth_env(os.environ))
    while True:
        try:
            with held_signals(), ray_leaves_signals_alone():
                ray.init(address=address, namespace=NAMESPACE, configure_logging=False, log_to_driver=True)
            return
        except ConnectionError as failed:
            ray.shutdown()
            if head is None or head.poll() is not None or time.monotonic() > deadline:
                raise NodeError(f"could not connect to the Ray head at {address} ({failed.__cause__ or failed}); "
                                f"the head logged: {_log_tail(head_log)}") from failed
            print(f"the Ray head at {address} has no node registered yet; trying again", flush=True)


def wanted_roles(job: RLJob) -> dict[Role, int]:
    """Workers of each role the run needs before it starts (pods, a train pod counting one per rank
    it hosts): every fixed-size role's, and one rollout pod (the rollout fleet grows as more join)."""
    spec = job.spec
    return {"controller": 1, "rollout": 1, "train": train_ranks(job),
            "reward": spec.reward.replicas if spec.reward.function is not None else 0,
            "history": 1}


def wait_for_roles(job: RLJob, say: Callable[[str], None], every_s: float = 60.0,
                   stop: Callable[[], bool] = lambda: False) -> bool:
    """Until the pods the run needs have joined, however long that takes (a pod may wait for a node,
    an image, a quota): what is missing is said when it changes and every `every_s`. False if
    `stop()` ended the wait first."""
    want = wanted_roles(job)
    said: tuple[dict[Role, int], float] | None = None
    while not stop():
        have = role_capacity()
        missing = {r: want[r] - have[r] for r in ROLES if have[r] < want[r]}
        if not missing:
            return True
        now = time.monotonic()
        if said is None or missing != said[0] or now - said[1] >= every_s:
            say(f"waiting for pods to join: {', '.join(f'{n} {r}' for r, n in missing.items())}")
            said = (missing, now)
        time.sleep(1.0)
    return False
