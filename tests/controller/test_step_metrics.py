"""StepMetrics: the typed row of metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from rhymerl.workers.run_folder.plots import trailing_mean
from rhymerl.workers.run_folder.run_dir import RunDir
from rhymerl.workers.run_folder.step_metrics import StepMetrics

BASE = dict(step=1, epoch=1, policy_version=1, prompts=4, samples=64, gen_rounds=1, time_rollout_s=2.0,
            time_reward_s=0.001, time_train_s=1.5, rollout_tokens=10656, rollout_tokens_per_s=5318.5,
            response_length_mean=166.5, response_length_max=194, reward_mean=0.5469, reward_failures=0,
            zero_std_frac=0.75, spec_rate=0.0, spec_acceptance=None, tokens_per_pass=1.0)


def test_a_row_holds_what_the_step_had_in_the_files_order() -> None:
    row = StepMetrics(**BASE, loss=-0.0, grad_norm=0.04, pg_clipfrac=0.0, entropy=0.01, kl=0.0).row()
    keys = list(row)
    assert keys[:3] == ["step", "epoch", "policy_version"]
    assert keys.index("zero_std_frac") < keys.index("loss") < keys.index("spec_rate")
    assert row["spec_acceptance"] is None  # set (no draft offered): kept as null
    assert "rollout_replicas" not in row and "skipped_samples" not in row  # never set: absent


def test_a_step_that_did_not_train_has_no_training_fields() -> None:
    row = StepMetrics(**BASE).row()
    assert not {"loss", "grad_norm", "kl", "entropy", "pg_clipfrac"} & row.keys()


def test_an_unknown_field_is_refused() -> None:
    with pytest.raises(ValidationError, match="bogus"):
        StepMetrics(**BASE, bogus=1)


def test_the_run_folder_reads_its_lines_back_typed(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    written = StepMetrics(**BASE, loss=float("nan"))
    run.append_metrics(written.row())
    line = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert line["loss"] is None  # nan is written as null
    back = run.step_metrics()
    assert [m.step for m in back] == [1] and back[0].loss is None and back[0].reward_mean == 0.5469


def test_the_plots_noisy_panels_average_each_step_with_up_to_an_epoch_of_steps_before_it() -> None:
    nan = float("nan")
    assert trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert trailing_mean([2.0, nan, 4.0], 3) == [2.0, 2.0, 3.0]  # a step without the value is left out
    smoothed = trailing_mean([nan, 1.0], 1)
    assert smoothed[0] != smoothed[0] and smoothed[1] == 1.0
