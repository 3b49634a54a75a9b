"""A Ray run at off-policy 1 whose controller is killed, or stopped again and again at other phases by
both signals, resumes to the uninterrupted run bit for bit."""

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


def test_stopped_three_times_by_both_signals_at_three_phases_each_resume_continues_to_the_uninterrupted_run(
        pipelined: Path, tmp_path: Path) -> None:
    """SIGTERM at train:2 (the controller checkpoints its step), SIGKILL at rollout:3 of the resumed run
    (back to that checkpoint), SIGTERM at metrics:3 of the next (step 3 checkpointed), then to the end:
    with the SIGKILL at train:3 above, three phases and both signals, and a run resumed from a resumed
    one ends bit for bit the uninterrupted one (before batch invariance 2 runs in 5 differed in their
    last bits)."""
    out = tmp_path / "run"
    res = run(out, [*PIPELINED, "checkpoint.every_steps=4"],
              {"RHYMERL_CRASH_AT": "train:2", "RHYMERL_CRASH_SIGNAL": "SIGTERM"})
    assert res.returncode == 128 + signal.SIGTERM, res.stderr
    assert [m["step"] for m in metrics(out)] == [1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000002"]
    assert_step_2_kept_step_3s_round(out)
    for crash_at, signal_name, code, kept in [("rollout:3", "SIGKILL", -signal.SIGKILL, [1, 2]),
                                              ("metrics:3", "SIGTERM", 128 + signal.SIGTERM, [1, 2, 3])]:
        res = run(out, [], {"RHYMERL_CRASH_AT": crash_at, "RHYMERL_CRASH_SIGNAL": signal_name}, resume=True)
        assert res.returncode == code, (crash_at, res.stderr)
        assert [m["step"] for m in metrics(out)] == kept, crash_at
    res = run(out, [], resume=True)
    assert res.returncode == 0, res.stderr
    assert_same_run(out, pipelined)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4]
