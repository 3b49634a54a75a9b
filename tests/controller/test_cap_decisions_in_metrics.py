"""A step's metrics carry the draft cap of its passes by batch size, and why (issue 41), from the
rollout worker's controller through the call's output and its scoring to the step loop's row."""

from __future__ import annotations

import itertools
from pathlib import Path

from jobs import make_job

from rhymerl.workers.controller.loop import run_steps
from rhymerl.workers.run_folder.run_dir import RunDir


def test_a_run_above_disable_above_batch_is_fixed_off_and_its_tail_below_drafts(tmp_path: Path) -> None:
    """2 prompts x 2 samples start at a batch of 4, above disableAboveBatch 2: off by the rule. The
    prompts ask for 1 to 10 operations, so one group finishes first and the other's 2 samples run the
    tail at a batch of 2, where the rule lets them draft, at the full window (no profile prices it)."""
    job = make_job("rollout.speculation.disable_above_batch=2", "algorithm.max_response_length=128",
                   "data.min_ops=1", "data.median_ops=3", "data.max_ops=10")
    run = RunDir(tmp_path / "run")
    run.create(job)
    typed = list(itertools.islice(run_steps(job, run), 2))
    rows = run.metrics()  # as metrics.jsonl holds them
    assert [r["step"] for r in rows] == [1, 2]
    for row, metrics in zip(rows, typed, strict=True):
        bands = row["draft_cap_by_batch"]
        assert isinstance(bands, dict) and set(bands) == {"2-3", "4-7"}
        busy, tail = bands["4-7"], bands["2-3"]
        assert "fixed-off" in busy["reasons"] and set(busy["reasons"]) <= {"fixed-off", "parked", "no-draft"}
        assert busy["drafted"] == 0.0 and busy["cap"] is None
        assert busy["passes"] == sum(busy["reasons"].values())
        assert tail["reason"] == "unpriced" and set(tail["reasons"]) <= {"unpriced", "no-draft"}
        assert tail["drafted"] > 0 and tail["cap"] == job.spec.rollout.speculation.window.max
        assert metrics.draft_cap_by_batch is not None and metrics.draft_cap_by_batch["2-3"].reason == "unpriced"
    assert run.step_metrics()[1].draft_cap_by_batch == typed[1].draft_cap_by_batch  # read back typed
