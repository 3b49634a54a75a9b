"""A Ray run at off-policy 1 runs rollout one version behind, and when it loses a train worker, and
then a rollout worker in the resumed run, it ends with the uninterrupted run's weights bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
from ray_runs import (
    PIPELINED,
    assert_same_run,
    metrics,
    run,
    samples,
)

from rhymerl.workers import dumps

pytestmark = pytest.mark.slow


def test_at_off_policy_1_rollout_runs_one_version_behind_and_records_it(pipelined: Path) -> None:
    assert len(samples(pipelined)) == 32
    versions = {(r.step, r.policy_version) for r in dumps.read_run(pipelined)}
    # step 2 was started before step 1 trained, step 3 before step 2 trained, ...
    assert versions == {(1, 0), (2, 0), (3, 1), (4, 2)}
    assert [m["policy_lag_max"] for m in metrics(pipelined)] == [0, 1, 1, 1]
    assert [m["policy_version"] for m in metrics(pipelined)] == [1, 2, 3, 4]


def test_a_train_worker_lost_mid_step_stops_the_run_and_resumed_it_loses_a_rollout_worker_and_ends_as_the_uninterrupted_run(
        pipelined: Path, tmp_path: Path) -> None:
    """A train pod evicted on a cluster: its worker's process dies (here as it writes step 3's dump, so
    that step's dump is on disk and its checkpoint is not). The run stops saying a member was lost (the
    controller pod exits MEMBER_LOST_EXIT_CODE there; here, one process, exit 1). Resumed, it loses a
    rollout worker in step 3 (killed in its call): that costs a rerun of the call and not one bit of
    the weights, and every sample trains once, bit for bit the uninterrupted run."""
    out = tmp_path / "run"
    res = run(out, PIPELINED, {"RHYMERL_CRASH_AT": "dump:3"})
    assert res.returncode == 1, res.stderr
    assert "TrainWorker" in res.stderr or "train worker" in res.stderr, res.stderr
    assert "rhymerl run --resume" in res.stderr
    assert [m["step"] for m in metrics(out)] == [1, 2]
    once = tmp_path / "once"
    once.mkdir()
    res = run(out, [], {"RHYMERL_CRASH_AT": "rollout-worker:3", "RHYMERL_CRASH_ONCE_DIR": str(once)}, resume=True)
    assert res.returncode == 0, res.stderr
    assert (once / "rollout-worker-3").exists(), "the worker never reached its crash point"
    assert [m["worker_reruns"] for m in metrics(out)] == [0, 0, 1, 0]
    assert_same_run(out, pipelined)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3, 4]
