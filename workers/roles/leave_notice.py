"""How a pod's process finds the role workers to pass the kubelet's SIGTERM on to: each worker that
takes SIGTERM as a notice to leave writes its pid into the pod's scratch folder (the supervisor,
workers/runtime/pod_supervisor.py, signals every pid there)."""

from __future__ import annotations

import os
from pathlib import Path

NODE_DIR_ENV = "RHYMERL_NODE_DIR"  # a pod's scratch folder: its role workers leave their pid files there
PID_SUFFIX = ".pid"


def leave_pid_file(role: str) -> None:
    """This process's pid file, where the pod's process looks (nowhere off a pod)."""
    node_dir = os.environ.get(NODE_DIR_ENV)
    if node_dir:
        Path(node_dir).mkdir(parents=True, exist_ok=True)
        (Path(node_dir) / f"{role}-{os.getpid()}{PID_SUFFIX}").write_text(str(os.getpid()))
