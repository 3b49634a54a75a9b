"""The reward and history workers' actors (a process each, per run) start without torch: importing their
modules must not load it, which would cost each about 2 CPU-seconds (the records they pass on live in
torch-free modules: rollout/generation.py, run_folder/loop_state.py, roles/groups.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def loads(module: str, other: str) -> bool:
    """Whether importing `module` in a fresh interpreter loads `other`."""
    code = f"import sys, {module}; print({other!r} in sys.modules)"
    res = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip() == "True"


@pytest.mark.parametrize("module", ["rhymerl.workers.roles.reward_worker", "rhymerl.workers.roles.history_worker"])
def test_a_reward_or_history_worker_module_imports_without_torch(module: str) -> None:
    assert not loads(module, "torch")


def test_the_check_sees_a_module_that_an_import_loads() -> None:
    assert loads("rhymerl.workers.roles.groups", "rhymerl.workers.reward.pool")
