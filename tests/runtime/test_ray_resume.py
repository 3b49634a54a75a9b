"""A Ray run at off-policy 1 whose controller is killed, sent SIGTERM or stopped at another phase resumes
to the uninterrupted run bit for bit."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from ray_runs import (
    MARK,
    PIPELINED,
    assert_same_run,
    assert_step_2_kept_step_3s_round,
    left_behind,
    metrics,
    run,
)

pytestmark = pytest.mark.slow


def test_a_controller_killed_mid_run_at_off_policy_1_resumes_to_the_uninterrupted_tokens_rewards_and_weights(
        pipelined: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    mark = f"killed-{tmp_path.name}"
    res = run(out, PIPELINED, {"RHYMERL_CRASH_AT": "train:3", MARK: mark})
    assert res.returncode == -signal.SIGKILL
    assert left_behind(mark) == [], "a Ray process outlived the SIGKILLed run that started it"
    assert [m["step"] for m in metrics(out)] == [1, 2]
    assert_step_2_kept_step_3s_round(out)
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    assert_same_run(out, pipelined)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4]


def test_on_sigterm_at_off_policy_1_the_controller_checkpoints_its_step_and_the_resumed_run_is_the_uninterrupted_one(
        pipelined: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = run(out, [*PIPELINED, "checkpoint.every_steps=4"],
              {"RHYMERL_CRASH_AT": "train:2", "RHYMERL_CRASH_SIGNAL": "SIGTERM"})
    assert res.returncode == 128 + 15, res.stderr
    assert [m["step"] for m in metrics(out)] == [1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000002"]
    assert_step_2_kept_step_3s_round(out)
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    assert_same_run(out, pipelined)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4]


@pytest.mark.parametrize(("crash_at", "signal_name", "kept"), [("rollout:3", "SIGKILL", [1, 2]),
                                                             ("metrics:3", "SIGTERM", [1, 2, 3])])
def test_stopped_at_another_phase_the_resumed_off_policy_1_run_ends_with_the_uninterrupted_weights(
        pipelined: Path, tmp_path: Path, crash_at: str, signal_name: str, kept: list[int]) -> None:
    """With the SIGKILL at train:3 and the SIGTERM at train:2 above: three phases, both signals,
    each resumed run bit for bit the uninterrupted one (before batch invariance 2 runs in 5
    differed in their last bits)."""
    out = tmp_path / "run"
    res = run(out, [*PIPELINED, "checkpoint.every_steps=2"],
              {"RHYMERL_CRASH_AT": crash_at, "RHYMERL_CRASH_SIGNAL": signal_name})
    assert res.returncode in (-signal.SIGKILL, 128 + signal.SIGTERM), res.stderr
    assert [m["step"] for m in metrics(out)] == kept
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    assert_same_run(out, pipelined)
