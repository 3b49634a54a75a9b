"""What a pod's process reads from the environment the operator's pod template gives it, and the
run folder it claims there (the controller's, and the train pods' for their checkpoints)."""

from __future__ import annotations

import os
from pathlib import Path

from rhymerl.errors import UserError
from rhymerl.workers.run_folder.identity import JOB_UID_ENV, RESUME_FROM_ENV, Claim, claim
from rhymerl.workers.runtime.ray_network import OBJECT_STORE_ENV

SAY_EVERY_S = 60.0  # how often a pod that waits says so again


def pod_env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if not value:
        raise UserError(f"{name}: not set (the operator's pod template sets it)")
    return value


def object_store_bytes() -> int | None:
    value = os.environ.get(OBJECT_STORE_ENV)  # the operator's, sized to the pod's /dev/shm
    return int(value) if value else None


def claim_run_dir() -> tuple[Path, Claim]:
    """This pod's run folder, made its job's (workers/run_folder/identity.py: an earlier job's of the same
    name, on a volume kept by name, is moved aside unless the job asks to go on with it)."""
    from rhymerl.workers.run_folder.run_dir import pod_run_dir

    path = pod_run_dir()
    return path, claim(path, os.environ.get(JOB_UID_ENV), os.environ.get(RESUME_FROM_ENV))
