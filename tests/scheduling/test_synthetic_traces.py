"""The synthetic generator against the published figures it is calibrated to."""

from __future__ import annotations

import numpy as np
import pytest

from rhymerl.tools.traces import PRESETS, TraceError, rank_stability, synthetic


@pytest.mark.parametrize(
    ("name", "paper_8", "paper_16"),
    [("math", 0.857, 0.797), ("code", 0.718, 0.626)],  # RhymeRL §6.3 table: Math-1 and Code-1 "Accurate"
)
def test_rank_stability_across_epochs_is_near_rhymerls_table(name: str, paper_8: float, paper_16: float) -> None:
    tr = synthetic(name, steps=32)
    r8, r16 = rank_stability(tr, 8), rank_stability(tr, 16)
    print(f"synthetic:{name}: {100 * r8.accurate:.1f}% stay in their group with 8 groups "
          f"(RhymeRL {100 * paper_8:.1f}%), {100 * r16.accurate:.1f}% with 16 (RhymeRL {100 * paper_16:.1f}%)")
    assert r8.pairs == 3
    assert abs(r8.accurate - paper_8) < 0.03
    assert abs(r16.accurate - paper_16) < 0.06
    assert r16.accurate < r8.accurate  # finer groups, more boundary crossings


def test_lengths_have_a_long_tail_and_the_mean_grows_over_training() -> None:
    cfg = PRESETS["math"]
    tr = synthetic("math", steps=16)
    out = tr.output_len
    assert np.percentile(out, 90) / np.median(out) > 1.8
    assert out.max() == cfg.max_len
    early = synthetic("math", steps=8, start_step=0).output_len.mean()
    late = synthetic("math", steps=8, start_step=300).output_len.mean()
    assert early < 1500 < 7000 < late  # ~1K at step 0, ~10K (truncated at 16K) near step 320 (RhymeRL Fig. 3a)


def test_inputs_are_short_and_unrelated_to_outputs() -> None:
    tr = synthetic("math", steps=8)
    assert np.percentile(tr.input_len, 90) < 220 and tr.input_len.max() <= 600  # PolyTrace §3.2
    assert abs(np.corrcoef(tr.input_len, tr.output_len)[0, 1]) < 0.1


def test_each_step_holds_whole_grpo_groups_and_an_epoch_visits_every_prompt_once() -> None:
    cfg = PRESETS["code"]
    tr = synthetic("code", steps=cfg.steps_per_epoch + 1)
    assert tr.epoch_length() == cfg.steps_per_epoch
    first_epoch = set(tr.prompt_id[: cfg.steps_per_epoch * cfg.prompts_per_step * cfg.group_size])
    assert len(first_epoch) == cfg.num_prompts


def test_an_unknown_synthetic_name_is_an_error() -> None:
    with pytest.raises(TraceError, match="unknown synthetic trace"):
        synthetic("synthetic:chess")
