"""The held-out class's generator knobs (issue 27): each knob against a hand-computed expectation."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rhymerl.cli.trace import trace_app
from rhymerl.tools.traces import PRESETS, SyntheticConfig, TraceError, generate, read_trace, synthetic
from rhymerl.tools.traces.synthetic import median_for_share, parse_overrides

HELD_OUT = ("dapo-math", "vl-video", "code-14b", "search-agent")
BASE = SyntheticConfig(name="synthetic:test", sigma_prompt=0.6, sigma_response=0.3, epoch_corr=0.0,
                       recurring_ids=False, max_len=4096, truncated_share=0.1)


def test_the_math_and_code_presets_draw_the_same_numbers_as_before_the_new_knobs() -> None:
    for name, out_sum, in_sum in (("math", 11704645, 228400), ("code", 11364348, 525040)):
        tr = synthetic(name, steps=2)
        assert (int(tr.output_len.sum()), int(tr.input_len.sum()), tr.prompt_id[0]) == (out_sum, in_sum, "p00054")


def test_the_length_scale_is_solved_for_the_truncated_share() -> None:
    # lognormal only, total sigma 1: P(L >= M) = 1 - Phi(ln(M / median)) = 1 - Phi(1) at median M / e
    lognormal = replace(BASE, sigma_prompt=0.0, sigma_response=1.0, truncated_share=0.5 * math.erfc(1 / math.sqrt(2)))
    assert median_for_share(lognormal) == pytest.approx(4096 / math.e, rel=1e-9)
    # half the responses Pareto (alpha 2), the body too narrow to reach M: 0.5 (median / M)^2 = 0.25
    pareto = replace(BASE, sigma_prompt=0.0, sigma_response=1e-3, pareto_share=0.5, pareto_alpha=2.0,
                     truncated_share=0.25)
    assert median_for_share(pareto) == pytest.approx(4096 / math.sqrt(2), rel=1e-9)


@pytest.mark.parametrize("share", [0.05, 0.25])
def test_the_drawn_truncated_share_is_the_requested_one(share: float) -> None:
    tr = generate(replace(BASE, steps=20, prompts_per_step=64, group_size=8, truncated_share=share, pareto_share=0.1))
    assert abs(np.mean(tr.output_len == 4096) - share) < 0.03  # 1,280 prompts: a few standard errors
    assert tr.output_len.max() == 4096 and tr.output_len.min() >= 1


@settings(max_examples=25, deadline=None)
@given(steps=st.integers(1, 6), prompts=st.integers(1, 12), group=st.integers(1, 16),
       last=st.floats(0.01, 1.0), seed=st.integers(0, 2**32 - 1))
def test_steps_hold_whole_groups_of_fresh_prompts_and_the_last_step_is_partial(
        steps: int, prompts: int, group: int, last: float, seed: int) -> None:
    cfg = replace(BASE, steps=steps, prompts_per_step=prompts, group_size=group, last_step_share=last, seed=seed)
    tr = generate(cfg)
    expected_groups = [prompts] * (steps - 1) + [max(1, math.floor(last * prompts + 1e-9))]
    seen: set[str] = set()
    for s, rows in enumerate(tr.step_rows()):
        ids = [tr.prompt_id[i] for i in rows.tolist()]
        counts = {pid: ids.count(pid) for pid in ids}
        assert len(counts) == expected_groups[s]
        assert set(counts.values()) == {group}
        assert not seen & counts.keys()
        seen |= counts.keys()
    assert tr.ids == "step-local" and tr.epoch_length() == 0


def test_a_seed_reproduces_a_trace_and_another_seed_draws_another_instance() -> None:
    a, b, c = synthetic("search-agent"), synthetic("search-agent"), synthetic("search-agent", seed=1)
    assert (a.output_len == b.output_len).all() and list(a.prompt_id) == list(b.prompt_id)
    assert len(a) == len(c) and not (a.output_len == c.output_len).all()


def test_prompt_length_predicts_output_length_only_as_far_as_input_corr_says() -> None:
    def corr(rho: float) -> float:
        tr = generate(replace(BASE, steps=8, group_size=1, sigma_response=0.0, truncated_share=0.0, max_len=10**7,
                              input_max=10**6, input_corr=rho))
        return float(np.corrcoef(np.log(tr.input_len), np.log(tr.output_len))[0, 1])

    assert abs(corr(0.0)) < 0.1 and corr(0.8) == pytest.approx(0.8, abs=0.1)


@pytest.mark.parametrize("name", HELD_OUT)
def test_held_out_presets_fall_in_the_issues_envelope(name: str) -> None:
    cfg = PRESETS[name]
    tr = synthetic(name)
    rows = tr.step_rows()
    assert 5 <= tr.num_steps <= 20 and tr.ids == "step-local"
    assert all(128 <= r.size <= 1024 for r in rows[:-1]) and 5 <= cfg.group_size <= 16
    assert rows[-1].size == cfg.last_step_groups * cfg.group_size < rows[0].size
    assert 0.0 < np.mean(tr.output_len == cfg.max_len) < 0.3


def test_held_out_presets_have_distinct_shapes() -> None:
    shapes = {(PRESETS[n].max_len, PRESETS[n].group_size, PRESETS[n].responses_per_step) for n in HELD_OUT}
    assert len(shapes) == len(HELD_OUT)


def test_knobs_parse_by_type_and_bad_values_name_the_option() -> None:
    assert parse_overrides(["recurring_ids=off", "truncated_share=0.2", "steps=5"], option="--set") == {
        "recurring_ids": False, "truncated_share": 0.2, "steps": 5}
    with pytest.raises(TraceError, match="--set recurring_ids: 'maybe' is not true or false"):
        parse_overrides(["recurring_ids=maybe"], option="--set")
    with pytest.raises(TraceError, match=re.escape("truncated_share: 0.6 must lie in 0..0.5")):
        synthetic("dapo-math", truncated_share=0.6)
    with pytest.raises(TraceError, match=re.escape("last_step_share: 0.0 must lie in")):
        synthetic("dapo-math", last_step_share=0.0)


def test_trace_synth_writes_a_preset_with_knobs_set(tmp_path: Path) -> None:
    out = tmp_path / "agent.csv"
    res = CliRunner().invoke(trace_app, ["synth", "search-agent", "-o", str(out), "--seed", "2", "--set", "steps=5",
                                         "--set", "last_step_share=1"])
    assert res.exit_code == 0, res.output
    tr = read_trace(out)
    assert tr.num_steps == 5 and len(tr) == 5 * PRESETS["search-agent"].responses_per_step and tr.ids == "step-local"
    bad = CliRunner().invoke(trace_app, ["synth", "search-agent", "-o", str(out), "--set", "tail=3"])
    assert bad.exit_code == 2 and "--set 'tail=3'" in bad.output
