"""`rhymerl bench rollout` end to end on a tiny finished run: every workload and method, outputs identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import rhymerl

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.errors import UserError
from rhymerl.tools.bench.rollout import _sources, method_spec, profile_table
from rhymerl.tools.bench.workload import load_run_workload
from rhymerl.workers.reward.pool import open_scorer
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.speculators import DraftCapController, HistoryDrafts


def test_bench_rollout_compares_methods_on_the_jobs_steps_and_on_a_pool(tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    res = rhymerl("bench", "rollout", "--run", str(tiny_run), "--batch-sizes", "job,4",
                  "--methods", "none,history,history-paper,history-mismatched-fixed,draft-model,fastest-of-n",
                  "--out", str(out))
    assert res.returncode == 0, res.stderr
    rows = json.loads((out / "results.json").read_text())
    assert [(r["batch"], r["method"]) for r in rows] == [
        (b, m) for b in ("job", 4) for m in ("none", "history", "history-paper", "history-mismatched-fixed",
                                             "draft-model", "fastest-of-n")]
    assert all(r["identical"] for r in rows)
    assert len({r["tokens"] for r in rows}) == 1  # 16 samples, the same tokens whatever the workload
    history = [r for r in rows if r["method"] in ("history", "history-paper", "draft-model")]
    assert all(r["spec_rate"] > 0 and r["tokens_per_pass"] > 1 for r in history)
    assert all(r["speedup"] == 1.0 for r in rows if r["method"] == "none")
    for r in rows:  # which source drafted: one source per method, several shares for fastest-of-n
        if r["method"] == "fastest-of-n":
            assert r["sources"] is not None and "history" in r["sources"]
            assert sum(s["share"] for s in r["sources"].values()) == pytest.approx(1.0, abs=1e-3)
        elif r["method"] == "history":
            assert set(r["sources"]) == {"history"}
    for name in ("table.md", "speedup.png", "verify_profile.png"):
        assert (out / name).stat().st_size > 0


def test_profile_table_shows_the_verify_column_only_where_the_profile_has_one() -> None:
    seconds = ((0.010, 0.012), (0.020, 0.030))
    vllm = profile_table(CostProfile((1, 4), (1, 3), seconds)).splitlines()
    assert vllm[2:] == ["| batch \\ tokens/seq | 1 | 3 |", "|---|---|---|", "| 1 | 10.00 | 12.00 |",
                        "| 4 | 20.00 | 30.00 |"]
    torch = profile_table(CostProfile((1, 4), (1, 3), seconds, verify_one=(0.011, 0.021))).splitlines()
    assert torch[2:] == ["| batch \\ tokens/seq | 1 | 3 | verify, 1 token |", "|---|---|---|---|",
                         "| 1 | 10.00 | 12.00 | 11.00 |", "| 4 | 20.00 | 30.00 | 21.00 |"]


def test_bench_rollout_names_a_bad_workload(tmp_path: Path) -> None:
    res = rhymerl("bench", "rollout", "--run", str(tmp_path), "--batch-sizes", "job,eight")
    assert res.returncode == 2
    assert "--batch-sizes: 'eight'" in res.stderr


def test_each_history_method_drafts_with_its_own_knobs() -> None:
    job = SpeculationSpec()
    knobs = {}
    for method in ("history", "history-paper", "history-mismatched-fixed"):
        spec = method_spec(method, job)
        source = _sources(method, spec, {True: {}, False: {}}, DraftCapController(spec))
        assert isinstance(source, HistoryDrafts)
        native = source.drafter._native
        knobs[method] = (native.prefix_max, native.prefix_min, native.min_prob, spec.disable_above_batch)
    assert knobs["history"] == (job.prefix.max, job.prefix.min, job.min_prob, None)
    assert knobs["history-paper"] == (7, 3, 0.0, None)
    assert knobs["history-mismatched-fixed"][:3] == knobs["history"][:3]
    assert knobs["history-mismatched-fixed"][3] is not None
    assert job.group_drafts and not method_spec("history-alone", job).group_drafts


def test_an_earlier_epoch_drafts_from_what_the_run_held_before_each_step(tiny_run: Path) -> None:
    first = load_run_workload(tiny_run, epoch=1)
    assert first.earlier == []
    with open_scorer(first.job.spec.reward) as scorer:
        drafting = first.drafting(scorer)
        assert drafting.before(0) == {}  # nothing recorded yet: only the group's own responses draft
        with pytest.raises(RuntimeError, match="step 1: step 0 of the epoch has not been generated"):
            drafting.before(1)
        engine = TorchEngine(first.native, first.tokenizer.eos_id, 64)
        step0 = engine.generate(drafting.steps[0], first.params, None)
        drafting.generated(0, step0)
        drafting.generated(0, step0)  # a second method's identical step: recorded once
        step1 = drafting.before(1)
        # the second step's 2 prompts draft from the first step's 8 responses, one recent index for both
        assert set(step1) == {r.prompt_id for r in drafting.steps[1]}
        [recent] = {id(i): i for i in step1.values()}.values()
        assert recent.n_responses == 8
        assert recent.n_tokens == sum(len(r.response_ids) for r in step0)
        following = load_run_workload(tiny_run)
        assert following.epoch == 2 and len(following.earlier) == 16
        own = following.drafting(scorer).before(0)  # each prompt its own epoch-1 index
        assert set(own) == {r.prompt_id for r in following.steps()[0]} and len({id(i) for i in own.values()}) == 2
    assert set(following.drafting_at_start()) == set(following.prompt_ids)
    for bad in (0, 3):
        with pytest.raises(UserError, match=f"--epoch {bad}: .* ran epochs 1-1; generate one of 1-2"):
            load_run_workload(tiny_run, epoch=bad)


def test_bench_rollout_measures_the_first_epoch_as_a_job_drafts_it(tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    res = rhymerl("bench", "rollout", "--run", str(tiny_run), "--epoch", "1", "--batch-sizes", "job",
                  "--methods", "none,history,history-alone", "--out", str(out))
    assert res.returncode == 0, res.stderr
    rows = {r["method"]: r for r in json.loads((out / "results.json").read_text())}
    assert {r["epoch"] for r in rows.values()} == {1}
    assert all(r["identical"] for r in rows.values())
    assert rows["history"]["spec_rate"] > 0 and rows["history"]["tokens_per_pass"] > 1
    assert rows["none"]["spec_rate"] == 0
    res = rhymerl("bench", "rollout", "--run", str(tiny_run), "--epoch", "3")
    assert res.returncode != 0 and "--epoch 3" in res.stderr
