"""`rhymerl run` with several rollout workers: the scheduler places samples, nothing else changes."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import rhymerl

from rhymerl.workers import dumps

# a short, hot job: arithmetic chains of 2-10 steps, so some answers are right and some wrong
SMALL = ["--set", "data.num_prompts=3", "--set", "data.min_ops=2", "--set", "data.median_ops=5",
         "--set", "data.max_ops=10", "--set", "algorithm.prompts_per_step=3", "--set", "algorithm.group_size=4",
         "--set", "algorithm.epochs=2", "--set", "algorithm.max_response_length=160",
         "--set", "rollout.temperature=2.0", "--set", "rollout.max_replicas=2"]


def test_two_rollout_workers_report_their_schedule_and_reproduce_the_one_worker_run(repo: Path, tmp_path: Path) -> None:
    runs = {}
    for replicas in (1, 2):
        out = tmp_path / f"r{replicas}"
        res = rhymerl("run", str(repo / "examples" / "quickstart.yaml"), "--out", str(out), *SMALL,
                      "--set", f"rollout.replicas={replicas}")
        assert res.returncode == 0, res.stderr
        runs[replicas] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    one, two = runs[1], runs[2]
    assert "2 workers makespan" in res.stdout
    assert [r["reward_mean"] for r in two] == [r["reward_mean"] for r in one]
    assert len({r["reward_mean"] for r in one}) > 1 or 0.0 < one[0]["reward_mean"] < 1.0  # not trivially equal
    assert [r.response_ids for r in dumps.read_run(tmp_path / "r2")] == [
        r.response_ids for r in dumps.read_run(tmp_path / "r1")]
    assert [r["schedule_ranking"] for r in two] == ["prompt-length", "history"]  # epoch 2 ranks by epoch 1
    for r in two:
        assert len(r["rollout_busy_s"]) == 2 and r["rollout_makespan_s"] >= max(r["rollout_busy_s"]) > 0
        assert 0.0 <= r["rollout_bubble"] < 1.0 and r["rollout_migrated"] >= 0
    assert one[0].keys() == two[0].keys() and one[0]["rollout_workers"] == 1  # the same row on any fleet
