"""Role workers that die mid-run on Ray are replaced and their work redone: no sample lost or counted
twice, the in-process run's tokens."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from ray_runs import RAY, TINY, TWO_WORKERS, go, metrics, reached, run, samples, start

pytestmark = pytest.mark.slow


def test_a_worker_that_dies_mid_step_is_restarted_and_its_samples_are_not_lost_or_doubled(
        in_process: Path, tmp_path: Path) -> None:
    """A reward worker dies in step 2 and a rollout worker in step 3, in one run (each step loses one).
    The rollout worker is killed held after its first snapshot of step 3, once the step loop has
    kept that snapshot (Ray delivers a streamed item after the yield: killed at once, the worker
    may take it along and its samples start over)."""
    once, holds = tmp_path / "once", tmp_path / "holds"
    once.mkdir()
    holds.mkdir()
    out = tmp_path / "run"
    proc = start(out, [*TINY, *RAY], {"RHYMERL_CRASH_AT": "reward-worker:2", "RHYMERL_CRASH_ONCE_DIR": str(once),
                                      "RHYMERL_HOLD_AT": "rollout-worker:3,snapshot-kept:3",
                                      "RHYMERL_HOLD_DIR": str(holds)})
    try:
        worker = int(reached(holds, "rollout-worker:3", proc).split()[0])
        reached(holds, "snapshot-kept:3", proc)
        os.kill(worker, signal.SIGKILL)
        go(holds, "rollout-worker:3")
        go(holds, "snapshot-kept:3")
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert (once / "reward-worker-2").exists(), "the reward worker never reached its crash point"
    assert samples(out) == samples(in_process)  # position-keyed sampling: the same tokens after the re-runs
    rows = metrics(out)
    assert [m["worker_reruns"] for m in rows] == [0, 1, 1, 0]
    events = (out / "events.log").read_text()
    assert "scoring rollout worker 0's 8 samples again" in events  # the reward worker's
    # the rollout worker's re-run went on from the tokens of the snapshot the step loop kept
    assert rows[2]["rollout_resumed_tokens"] > 0
    assert "go on elsewhere from the tokens they had" in events


def test_a_rollout_worker_that_dies_while_others_take_over_its_samples_loses_none(
        in_process: Path, tmp_path: Path) -> None:
    once = tmp_path / "once"
    once.mkdir()
    out = tmp_path / "run"
    res = run(out, [*TINY, *RAY, *TWO_WORKERS],
              {"RHYMERL_CRASH_AT": "rollout-worker:1", "RHYMERL_CRASH_ONCE_DIR": str(once)})
    assert res.returncode == 0, res.stderr
    assert (once / "rollout-worker-1").exists(), "no worker reached its crash point"
    assert samples(out) == samples(in_process)
    assert [m["worker_reruns"] for m in metrics(out)] == [1, 0, 0, 0]
    # each group ran on both workers: siblings' tokens crossed between them (over Ray, group drafts)
    assert sum(int(str(m["rollout_group_tokens_heard"])) for m in metrics(out)) > 0


def test_without_its_history_worker_rollout_goes_on_without_drafts_and_says_so(
        in_process: Path, tmp_path: Path) -> None:
    once = tmp_path / "once"
    once.mkdir()
    out = tmp_path / "run"
    # a third epoch: the restarted worker (it refills from the train worker's dumps, which may be busy
    # training) need not be back within the 10 s step 4 waits for it, but is by step 5
    res = run(out, [*TINY, *RAY, "algorithm.epochs=3", "rollout.speculation.group_drafts=false"],
              {"RHYMERL_CRASH_AT": "history-worker:3", "RHYMERL_CRASH_ONCE_DIR": str(once)})
    assert res.returncode == 0, res.stderr
    assert [s for s in samples(out) if s[0] <= 4] == samples(in_process)  # drafts never change tokens
    rows = metrics(out)
    ok = [m["history_ok"] for m in rows]
    assert ok[:3] == [True, True, False] and ok[4:] == [True, True]
    assert rows[2]["spec_rate"] == 0.0 and all(m["spec_rate"] > 0 for m in rows[4:])  # refilled from the dumps
    assert "cannot serve indexes" in (out / "events.log").read_text()


def test_a_rollout_worker_killed_as_a_weight_broadcast_starts_costs_a_fallback_not_a_sample(
        in_process: Path, tmp_path: Path) -> None:
    """Weights go by broadcast (rollout.weight_sync: collective, the default): tokens equal the
    in-process run's only if every version arrives bit for bit. One of two rollout workers dies as
    version 1's broadcast starts, the fleet's group still forming: the other, held until the
    group's timeout, loads the object store's copy (`weight_fallbacks`, a note), the dead one's
    samples resume elsewhere, nothing is lost."""
    out = tmp_path / "run"
    once = tmp_path / "once"
    once.mkdir()
    res = run(out, [*TINY, *RAY, "rollout.replicas=2", "rollout.max_replicas=2"],
              {"RHYMERL_CRASH_AT": "weight-receive:1", "RHYMERL_CRASH_ONCE_DIR": str(once),
               "RHYMERL_WEIGHT_SYNC_TIMEOUT_S": "10"})
    assert res.returncode == 0, res.stderr
    assert (once / "weight-receive-1").exists()  # the worker did die there
    assert samples(out) == samples(in_process)
    rows = metrics(out)
    assert sum(int(str(m["weight_fallbacks"])) for m in rows) >= 1
    assert "took the object store's" in (out / "events.log").read_text()
