"""Pods as processes: a kubelet stand-in that runs the StatefulSets the operator renders as local
processes, one per replica, with each pod's command, arguments and environment.

What a kubelet and a cluster network would provide, and how it is stood in for here:
- volumes: each volumeMount's path is a folder (the ConfigMap's files written into the `spec`
  volume's folder, a Secret's into its volume's: the job's Ray token; `scratch` and `data` one folder
  per pod), and the mount paths in arguments and environment values are rewritten to those folders;
- downward API: metadata.name, metadata.namespace, status.podIP (POD_IP: this machine's address as Ray
  sees it);
- pod IPs and DNS: every pod shares this machine's loopback, so each gets its own free port for
  RHYMERL_HTTP_PORT and its own block of ports for its Ray node (RHYMERL_RAY_PORT_BASE), and the
  controller Service's name in RHYMERL_CONTROLLER resolves to POD_IP with a free port for the
  Ray head;
- the image's entrypoint: `rhymerl` is this environment's console script.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local_servers import free_port
from ray._private import services

from rhymerl.api.k8s_values import quantity_value

# Every pod's IP, as Ray sees this machine: Ray swaps a loopback address for the machine's routed one
# where there is a default route (ray._private.services.resolve_ip_for_localhost), so nodes registered
# at 127.0.0.1 would not be found there; without a route this is 127.0.0.1.
POD_IP: str = services.get_node_ip_address()


@dataclass
class Pod:
    name: str
    role: str
    argv: list[str]
    env: dict[str, str]
    root: Path
    http_port: int
    grace_s: int = 30
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exits: list[int] = field(default_factory=list)  # each exit of its main process, in order
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.root / "pod.log"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url(path), timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.is_file() else ""


class Cluster:
    """The rendered objects, and how a pod of one of their StatefulSets is made (as the StatefulSet
    controller would, for any ordinal: scaling up makes the next ones)."""

    def __init__(self, objects: list[dict[str, Any]], root: Path, extra_env: dict[str, str] | None = None) -> None:
        self.objects, self.root, self.extra_env = objects, root, extra_env or {}
        self.config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
        self.secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
        self.sets = {o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: o
                     for o in objects if o["kind"] == "StatefulSet"}
        self.head_port = free_port()
        self.port_blocks = iter(range(free_block(), 65000, 64))

    def pods(self) -> list[Pod]:
        """One Pod per replica of every StatefulSet, as rendered."""
        return [self.pod(role, i) for role, sts in self.sets.items() for i in range(sts["spec"]["replicas"])]

    def pod(self, role: str, ordinal: int) -> Pod:
        sts = self.sets[role]
        template = sts["spec"]["template"]
        (container,) = template["spec"]["containers"]
        volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
        bin_dir = Path(sys.executable).parent
        name = f"{sts['metadata']['name']}-{ordinal}"
        pod_root = self.root / name
        mounts: dict[str, str] = {}
        for m in container.get("volumeMounts", []):
            folder = pod_root / "volumes" / m["name"]
            folder.mkdir(parents=True, exist_ok=True)
            cm = volumes.get(m["name"], {}).get("configMap")
            if cm is not None:
                for key, text in self.config_maps[cm["name"]]["data"].items():
                    (folder / key).write_text(text)
            secret = volumes.get(m["name"], {}).get("secret")
            if secret is not None:
                if secret["secretName"] not in self.secrets:
                    raise KeyError(f"Secret {secret['secretName']} is not among the objects (the operator makes it)")
                for key, text in self.secrets[secret["secretName"]]["stringData"].items():
                    (folder / key).write_text(text)
            mounts[m["mountPath"]] = str(folder)
        http_port = free_port()
        local = functools.partial(_mounted, mounts)
        env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "LANG": "C.UTF-8"}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = local(e["value"])
            elif "fieldRef" in e.get("valueFrom", {}):
                path = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = {"metadata.name": name, "metadata.namespace": sts["metadata"]["namespace"],
                                  "status.podIP": POD_IP}[path]
            elif "resourceFieldRef" in e.get("valueFrom", {}):  # the kubelet's: a request in cores, rounded up
                ref = e["valueFrom"]["resourceFieldRef"]
                assert ref["resource"] == "requests.cpu" and ref["divisor"] == "1", ref
                owner = next(c for c in template["spec"]["containers"] if c["name"] == ref["containerName"])
                env[e["name"]] = str(math.ceil(float(quantity_value(owner["resources"]["requests"]["cpu"]))))
        env["RHYMERL_HTTP_PORT"] = str(http_port)
        env["RHYMERL_RAY_PORT_BASE"] = str(next(self.port_blocks))
        env["RHYMERL_CONTROLLER"] = f"{POD_IP}:{self.head_port}"
        env.update(self.extra_env)
        argv = [str(bin_dir / container["command"][0]), *(local(a) for a in container.get("args", []))]
        return Pod(name, role, argv, env, pod_root, http_port, grace_s=template["spec"]["terminationGracePeriodSeconds"])


def gcs_answers(address: str, token: str | None) -> str:
    """What the Ray head's GCS at `address` answers a client holding `token` (None: none): "OK" or the
    gRPC status code's name. One call, no Ray client (a refused ray.init retries for 20 s)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token is not None else []
    generated: Any = gcs_service_pb2  # protobuf's generated modules: no type information
    with grpc.insecure_channel(address) as channel:
        stub: Any = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.GetClusterId(generated.GetClusterIdRequest(), timeout=10, metadata=metadata)
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return "OK"


def pods_of(objects: list[dict[str, Any]], root: Path, extra_env: dict[str, str] | None = None) -> list[Pod]:
    """One Pod per replica of every StatefulSet in `objects` (rendered with their ConfigMap)."""
    return Cluster(objects, root, extra_env).pods()


def free_block(size: int = 64 * 16) -> int:
    """The start of `size` consecutive ports that are free now, above the ephemeral range's usual start."""
    import socket

    for start in range(20000, 32000, size):
        try:
            for port in range(start, start + size, 7):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return start
    raise RuntimeError("no free block of ports")


def _mounted(mounts: dict[str, str], value: str) -> str:
    """`value` with a mount path at its start replaced by the folder standing in for it."""
    for path in sorted(mounts, key=len, reverse=True):
        if value == path or value.startswith(path + "/"):
            return mounts[path] + value[len(path):]
    return value


class Kubelet:
    def __init__(self, pods: list[Pod]) -> None:
        self.pods = pods
        self.gone: list[Pod] = []  # pods deleted or replaced: whatever they left behind goes at the end

    def start(self, pod: Pod) -> None:
        with pod.log.open("ab") as out:
            pod.proc = subprocess.Popen(pod.argv, env=pod.env, cwd=pod.root, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def start_all(self, head_timeout_s: float = 240.0) -> None:
        """Every pod, the controller's first, the others once its Ray head has started (or
        `head_timeout_s` passed). On one machine the member pods' Ray nodes starting beside the head
        (each a raylet and several Python agents) can keep the head's GCS from answering its own
        raylet within the 30 s Ray allows it (fixed in ray/_private/node.py), which a cluster, where
        each pod has its own cores, does not see; the members still join a head that is up."""
        controllers = [p for p in self.pods if p.role == "controller"]
        for pod in controllers:
            self.start(pod)
        deadline = time.monotonic() + head_timeout_s
        while controllers and time.monotonic() < deadline and not all(_head_started(p) for p in controllers):
            time.sleep(0.5)
        for pod in self.pods:
            if pod not in controllers:
                self.start(pod)

    def restart_exited(self) -> None:
        """restartPolicy: Always. A container whose main process exited is torn down first (what its
        main process started, e.g. a Ray node, goes with it)."""
        for pod in self.pods:
            if pod.proc is not None and pod.proc.poll() is not None:
                pod.exits.append(pod.proc.returncode)
                for pid in processes_of(pod):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                pod.restarts += 1
                self.start(pod)

    def add(self, pod: Pod) -> None:
        """A new pod (a StatefulSet scaled up) starts."""
        self.pods.append(pod)
        self.start(pod)

    def replace(self, old: Pod, new: Pod) -> None:
        """The pod is gone for good (its node lost, or it was deleted) and the StatefulSet made `new`
        in its place: every process of the old one is killed first, as its node's loss would."""
        self.kill(old)
        self.pods.remove(old)
        self.gone.append(old)
        self.add(new)

    def delete(self, pod: Pod) -> int | None:
        """The pod is deleted (a scale-down, a spot notice, a drain): SIGTERM to its main process,
        SIGKILL to whatever is left after its grace period; it is not restarted. Its exit code."""
        assert pod.proc is not None
        self.pods.remove(pod)
        self.gone.append(pod)
        pod.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = pod.proc.wait(pod.grace_s)
        except subprocess.TimeoutExpired:
            code = None
        for pid in processes_of(pod):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pod.proc.wait()
        return code

    def kill(self, pod: Pod) -> None:
        """The container dies at once: every process in it, found as a cgroup would find them (Ray's
        daemons leave the pod's process group, not its environment); also what a main process that
        already died left behind."""
        assert pod.proc is not None
        for pid in processes_of(pod):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pod.proc.wait()

    def stop_all(self, grace_s: float = 60.0) -> dict[str, int | None]:
        """SIGTERM every pod's main process (a kubelet signals a container's PID 1, not its other
        processes: the pod's own shutdown orders the rest), SIGKILL what is left after the grace
        period; the exit codes."""
        for pod in self.pods:
            if pod.proc is not None and pod.proc.poll() is None:
                pod.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        codes: dict[str, int | None] = {}
        for pod in self.pods:
            if pod.proc is None:
                continue
            try:
                codes[pod.name] = pod.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                codes[pod.name] = pod.proc.wait()
        for pod in [*self.pods, *self.gone]:  # whatever a pod's processes left behind
            for pid in processes_of(pod):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return codes


def _head_started(pod: Pod) -> bool:
    """Whether the pod's Ray head said it started (`ray start`'s own line), or its process ended."""
    if pod.proc is not None and pod.proc.poll() is not None:
        return True
    return any(b"Ray runtime started" in log.read_bytes() for log in pod.root.rglob("ray-head.log"))


def processes_of(pod: Pod) -> list[int]:
    """Every live process that inherited the pod's environment (its RHYMERL_POD_NAME and folder)."""
    marker = f"RHYMERL_DATA_DIR={pod.env.get('RHYMERL_DATA_DIR', '')}".encode()
    name = f"RHYMERL_POD_NAME={pod.name}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if name in environ and marker in environ:
            found.append(int(entry.name))
    return found
