"""The reward and history workers' modules import without torch, which would cost each actor (a process
per run) about 2 CPU-seconds: the records they pass on live in torch-free modules
(rollout/generation.py, run_folder/loop_state.py, roles/groups.py), and so does the transport seam
(role_apis.py, transport.py, runtime/ray_transport.py). Their constructor arguments unpickle without
torch too: on Ray unpickling an actor handle loads its actor's class, so a history worker given the
train worker's handle would load torch (it is refilled by the step loop instead: history_client.py)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
from jobs import make_job

from rhymerl.workers.run_folder.loop_state import LoopState


def loads(module: str, other: str, pickled: bytes = b"") -> bool:
    """Whether importing `module`, then unpickling `pickled` (if any), in a fresh interpreter loads `other`."""
    code = (f"import pickle, sys, {module}; data = sys.stdin.buffer.read(); data and pickle.loads(data); "
            f"print({other!r} in sys.modules)")
    res = subprocess.run([sys.executable, "-P", "-c", code], input=pickled, capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()
    return res.stdout.decode().strip() == "True"


@pytest.mark.parametrize("module", ["rhymerl.workers.roles.reward_worker", "rhymerl.workers.roles.history_worker"])
def test_a_reward_or_history_worker_module_imports_without_torch(module: str) -> None:
    assert not loads(module, "torch")


def test_the_check_sees_a_module_that_an_import_loads() -> None:
    assert loads("rhymerl.workers.roles.groups", "rhymerl.workers.reward.pool")


def test_the_transport_seam_imports_without_torch() -> None:
    assert not loads("rhymerl.workers.runtime.ray_transport", "torch")
    assert not loads("rhymerl.workers.controller.history_client", "torch")


def test_a_reward_or_history_workers_constructor_arguments_unpickle_without_torch() -> None:
    job = make_job()
    assert not loads("rhymerl.workers.roles.reward_worker", "torch", pickle.dumps((job,)))
    assert not loads("rhymerl.workers.roles.history_worker", "torch", pickle.dumps((job, "run-id")))


def test_the_check_sees_a_module_that_unpickling_loads() -> None:
    assert loads("sys", "rhymerl.workers.run_folder.loop_state", pickle.dumps(LoopState()))
