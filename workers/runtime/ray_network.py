"""Where a pod's Ray node listens and how its peers prove they belong to the job.

Ray picks most of its ports at random unless told; here every port it opens is fixed, so that the
operator's NetworkPolicy (operator/manifests/network.py) names the very ports `ray start` is given
(workers/runtime/node.py): one definition for both. Token authentication (Ray's own, RAY_AUTH_MODE
token) keeps out any client that does not hold the job's token, which the operator keeps in a
Secret per job and mounts at TOKEN_PATH. Plain data: no Ray import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

AUTH_MODE_ENV = "RAY_AUTH_MODE"  # Ray's: "token" or "disabled"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"  # Ray's: a file holding the token
TOKEN_ENV = "RAY_AUTH_TOKEN"  # Ray's: the token itself
TOKEN_KEY = "token"  # the key of the job's Secret, and the file name it is mounted as
TOKEN_DIR = "/var/run/rhymerl/ray"
TOKEN_PATH = f"{TOKEN_DIR}/{TOKEN_KEY}"
OBJECT_STORE_ENV = "RHYMERL_OBJECT_STORE_BYTES"  # a pod's Ray object store (`ray start --object-store-memory`)
OBJECT_STORE_SHARE = 0.3  # of a pod's memory: Ray's own default share, made explicit to size /dev/shm to it

POD_PORT_BASE = 20000  # a pod has its own IP: every pod's node uses the same block
POD_WORKER_PORTS = 1000  # Ray worker processes (each binds one) a pod may run at once
SHARED_HOST_WORKER_PORTS = 48  # several nodes on one host (pods as processes): a block of 64 each


@dataclass(frozen=True)
class RayPorts:
    """The ports one node opens besides the head's GCS port (RHYMERL_CONTROLLER's): `base` up."""

    base: int
    worker_ports: int

    def named(self) -> dict[str, int]:
        """Port name (a container port name: at most 15 characters) -> port, for single ports."""
        b = self.base
        return {"ray-node": b, "ray-objects": b + 1, "ray-metrics": b + 2, "ray-agent-grpc": b + 3,
                "ray-agent-http": b + 4, "ray-runtime-env": b + 5, "ray-client": b + 6}

    @property
    def workers(self) -> tuple[int, int]:
        """The first and last port of Ray's worker processes (and the driver's)."""
        return self.base + 16, self.base + 15 + self.worker_ports

    def args(self, head: bool) -> list[str]:
        """`ray start` flags that fix them; the Ray client server runs on the head only."""
        n = self.named()
        out = [f"--node-manager-port={n['ray-node']}", f"--object-manager-port={n['ray-objects']}",
               f"--metrics-export-port={n['ray-metrics']}", f"--dashboard-agent-grpc-port={n['ray-agent-grpc']}",
               f"--dashboard-agent-listen-port={n['ray-agent-http']}",
               f"--runtime-env-agent-port={n['ray-runtime-env']}",
               f"--min-worker-port={self.workers[0]}", f"--max-worker-port={self.workers[1]}"]
        if head:
            out.append(f"--ray-client-server-port={n['ray-client']}")
        return out


POD_PORTS = RayPorts(POD_PORT_BASE, POD_WORKER_PORTS)


def auth_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Ray's authentication settings for a node or driver started with `environ`: token mode when the
    environment says so or holds a token (a pod: the operator sets both), disabled otherwise (a run
    on one machine, where nothing else reaches it). Token mode without a token fails Ray's start: a
    pod whose Secret is missing never runs an open node."""
    mode = environ.get(AUTH_MODE_ENV) or ("token" if environ.get(TOKEN_PATH_ENV) or environ.get(TOKEN_ENV)
                                          else "disabled")
    return {AUTH_MODE_ENV: mode, "RAY_USAGE_STATS_ENABLED": "0"}
