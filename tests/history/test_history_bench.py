"""`rhymerl bench drafter` / `bench acceptance` and their baselines, on tiny data (speed is not tested here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from history_reference import ngram_draft
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from rhymerl.algorithms.drafting import HistoryIndex
from rhymerl.algorithms.drafting import _suffix_index as native
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.cli.bench import bench_app
from rhymerl.tools.bench.acceptance import (
    BOUND,
    FASTEST_GROUP,
    FASTEST_HISTORY_GROUP,
    GROUP,
    RECENT_GROUP,
    AcceptanceConfig,
)
from rhymerl.tools.bench.acceptance import run as run_acceptance
from rhymerl.tools.bench.draft_replay import accepted_lengths, replay, replay_units
from rhymerl.tools.bench.draft_sources import arctic_status, fastest_of_n, histospec, ngram
from rhymerl.tools.bench.draft_workloads import PromptWork, late_divergence_workload, synthetic_workload
from rhymerl.tools.bench.drafter import DrafterBenchConfig
from rhymerl.tools.bench.drafter import run as run_drafter
from rhymerl.workers.dumps import RolloutRecord, write_step

QUIET = Console(quiet=True)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=4),
    window=st.integers(0, 6),
    min_n=st.integers(1, 3),
    extra=st.integers(0, 3),
)
def test_ngram_baseline_matches_the_reference(rows: list[list[int]], window: int, min_n: int, extra: int) -> None:
    width = max(len(r) for r in rows) + 1
    buf = np.zeros((len(rows), width), dtype=np.int32)
    for i, r in enumerate(rows):
        buf[i, : len(r)] = r
    lengths = np.asarray([len(r) for r in rows], dtype=np.int64)
    offsets, tokens = native.ngram_draft(buf, lengths, np.full(len(rows), window, dtype=np.int32), min_n, min_n + extra)
    got = [tokens[offsets[i] : offsets[i + 1]].tolist() for i in range(len(rows))]
    assert got == [ngram_draft(r, window, min_n, min_n + extra) for r in rows]


def test_verifier_accepts_the_matching_prefix_of_each_draft() -> None:
    targets = np.asarray([[1, 2, 3, 4, 0], [5, 6, 7, 0, 0]], dtype=np.int32)
    offsets = np.asarray([0, 3, 5], dtype=np.int64)
    drafts = np.asarray([2, 3, 9, 7, 8], dtype=np.int32)  # seq 0 at position 1: 2 3 match; seq 1 at 2: 7 then end
    got = accepted_lengths(offsets, drafts, targets, np.asarray([1, 2]), np.asarray([4, 3]))
    assert got.tolist() == [2, 1]


def test_synthetic_histories_share_long_spans_between_epochs() -> None:
    (unit,) = synthetic_workload(prompts=1, responses=4, length=2000, seed=1)
    assert len(unit.history) == 4 and len(unit.targets) == 4
    assert all(len(t) == 2000 for t, _ in unit.history)
    index = HistoryIndex.build(unit.history)
    bound = sum(index.oracle_accepted(t, 3) for t in unit.targets) / sum(len(t) for t in unit.targets)
    assert 0.6 < bound < 0.99  # similar, not identical (RhymeRL §5.1 reports 75-93%)


def test_a_late_divergence_history_drafts_the_rewarded_tail_only_when_weighted() -> None:
    (unit,) = late_divergence_workload(prompts=1, responses=4, trunk=40, tail=10, wrong_share=0.75, noise=0.0)
    assert [r for _, r in unit.history] == [0.0, 0.0, 0.0, 1.0]  # three slipped, one correct
    right, wrong = unit.history[3][0], unit.history[0][0]
    assert (right[:40] == wrong[:40]).all() and (right[40:] != wrong[40:]).any()
    trunk = right[:40]
    assert HistoryIndex.build(unit.history, reward_weighted=True).draft(trunk, 10).tolist() == right[40:].tolist()
    assert HistoryIndex.build(unit.history).draft(trunk, 10).tolist() == wrong[40:].tolist()


def write_run(run_dir: Path, epochs: int = 3, prompts: int = 2, samples: int = 3, shared: bool = False) -> None:
    """shared: every prompt's responses vary one base (a task whose answers share their form)."""
    rng = np.random.default_rng(0)
    bases = {p: rng.integers(0, 50, size=120) for p in range(prompts)}
    if shared:
        bases = {p: bases[0] for p in bases}
    step = 0
    for epoch in range(1, epochs + 1):
        for p in range(prompts):
            step += 1
            records = []
            for s in range(samples):
                resp = bases[p].copy()
                flip = rng.random(resp.size) < 0.05
                resp[flip] = rng.integers(0, 50, size=int(flip.sum()))
                records.append(RolloutRecord(step=step, epoch=epoch, prompt_id=f"p{p}", sample_index=s, prompt_len=4,
                                             prompt_ids=[1, 2, 3, p], response_ids=resp.tolist(),
                                             reward=float(s % 2), finish_reason="stop", policy_version=step - 1))
            write_step(run_dir, step, records)


def test_acceptance_bench_replays_each_epoch_against_the_previous_one(tmp_path: Path) -> None:
    write_run(tmp_path / "run")
    with_arctic = arctic_status()[0]
    results = run_acceptance(AcceptanceConfig(dumps=tmp_path / "run", arctic=with_arctic), tmp_path / "out", QUIET)
    assert [p["epochs"] for p in results["pairs"]] == ["none->1", "1->2", "2->3"]
    assert (tmp_path / "out" / "acceptance.png").stat().st_size > 0
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    methods = saved["all"]
    expected = {"histospec (reward)", "histospec (frequency)", "n-gram", BOUND, FASTEST_GROUP, FASTEST_HISTORY_GROUP}
    assert expected <= set(methods)
    assert any(name.startswith("arctic") for name in methods) == with_arctic
    lead = f"{GROUP}, 1 sibling 128 steps ahead"
    for name, m in methods.items():  # group and n-gram replay the first epoch too, the lead only that one
        first_only = name in (lead, FASTEST_GROUP, RECENT_GROUP) or ", batch " in name
        epochs = 1 if first_only else 3 if name in (GROUP, "n-gram") else 2
        assert m["tokens"] == epochs * 2 * 3 * 120
        assert 0.0 <= m["accepted_fraction"] <= 1.0 and m["tokens_per_step"] >= 1.0
    assert methods["histospec (reward)"]["accepted_fraction"] > 0.5
    first = saved["pairs"][0]["methods"]  # siblings generated together: nobody runs ahead, a lead does
    assert first[GROUP]["tokens_per_step"] < first[lead]["tokens_per_step"]
    assert [g["epochs"] for g in saved["group_index"]] == ["none->1", "1->2", "2->3"]
    assert methods[BOUND]["accepted_fraction"] >= methods["histospec (reward)"]["accepted_fraction"]


def test_a_first_epoch_drafts_from_the_earlier_steps_responses_to_other_prompts(tmp_path: Path) -> None:
    write_run(tmp_path / "run", epochs=1, prompts=3, shared=True)  # a step per prompt: steps 2 and 3 have a past
    first = run_acceptance(AcceptanceConfig(dumps=tmp_path / "run", arctic=False), tmp_path / "out",
                           QUIET)["pairs"][0]["methods"]
    assert first[RECENT_GROUP]["tokens"] == first[GROUP]["tokens"] == 3 * 3 * 120
    assert first[RECENT_GROUP]["tokens_per_step"] > 1.5 * first[GROUP]["tokens_per_step"]


def test_a_batch_limited_replay_lets_a_groups_later_samples_draft_from_its_earlier_ones() -> None:
    rng = np.random.default_rng(3)
    units = [PromptWork(f"p{i}", np.zeros(1, dtype=np.int32), [], [base, base.copy()])
             for i, base in enumerate(rng.permutation(500)[:60].astype(np.int32).reshape(2, 30))]
    def replayed(batch: int | None, spread: bool) -> tuple[int, int]:
        stats = replay_units(histospec([None, None], SpeculationSpec(), groups=True), units, batch=batch,
                             spread=spread)
        return stats.verify_steps, len(stats.step_seconds)
    together, together_steps = replayed(None, False)
    assert together == 4 * 30 and together_steps == 30  # level siblings: nothing to draft, every token a pass
    by_group, by_group_steps = replayed(2, False)  # p0's two in lockstep, then p1's two
    assert by_group == 4 * 30 and by_group_steps == 60
    spread, spread_steps = replayed(2, True)  # p0 and p1's first samples, then their second: drafted
    assert spread_steps - 30 < 15 and spread < 2 * 30 + 2 * 15
    one, _ = replayed(1, False)  # one at a time: every second sample drafts from its finished sibling
    assert one == spread


def test_a_sequence_replayed_from_mid_response_drafts_from_the_tokens_it_starts_with() -> None:
    target = np.random.default_rng(0).integers(0, 1000, size=300).astype(np.int32)
    index = HistoryIndex.build([(target, 1.0)])
    stats = replay(histospec([index], SpeculationSpec()), [0], [np.zeros(1, dtype=np.int32)], [target], [150],
                   iterations=1)
    assert stats.drafted > 0 and stats.accepted == stats.drafted  # its history continues the 150 tokens it has


def test_an_ngram_replay_keeps_drafting_past_the_engines_default_context_of_2048_tokens() -> None:
    pattern = np.random.default_rng(1).permutation(1000)[:50].astype(np.int32)
    unit = PromptWork("p", np.zeros(1, dtype=np.int32), [], [np.tile(pattern, 60)])  # 3000 tokens
    assert replay_units(ngram(SpeculationSpec()), [unit]).accepted_fraction > 0.9


def test_fastest_of_n_tells_its_sources_apart_by_name() -> None:
    knobs = SpeculationSpec()
    with pytest.raises(ValueError, match="distinct names"):
        fastest_of_n([ngram(knobs), ngram(knobs)], knobs)


def test_drafter_bench_runs_end_to_end_on_tiny_synthetic_data(tmp_path: Path) -> None:
    cfg = DrafterBenchConfig(prompts=2, responses=2, length=300, batches=(1, 4), iterations=5, build_repeats=1,
                             arctic=False)
    results = run_drafter(cfg, tmp_path, QUIET)
    assert "skipped" in results["arctic"]
    assert set(results["latency"]) == {"histospec", "n-gram"}
    assert [r["batch"] for r in results["latency"]["histospec"]] == [1, 4]
    assert results["build"]["histospec"]["tokens"] == 2 * 2 * 300
    assert results["build"]["histospec"]["serialized_bytes"] > 0
    for name in ("results.json", "table.md", "drafter.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "Per-sequence latency" in (tmp_path / "table.md").read_text()


def test_drafter_bench_reads_rollout_dumps(tmp_path: Path) -> None:
    write_run(tmp_path / "run", epochs=2)
    cfg = DrafterBenchConfig(dumps=tmp_path / "run", batches=(2,), iterations=3, build_repeats=1, arctic=False)
    results = run_drafter(cfg, tmp_path / "out", QUIET)
    assert results["build"]["histospec"]["tokens"] == 2 * 3 * 120
    assert "rollout dumps" in results["data"]


def test_bench_commands_are_registered_and_report_bad_runs(tmp_path: Path) -> None:
    runner = CliRunner()
    for command in ("drafter", "acceptance"):
        assert runner.invoke(bench_app, [command, "--help"]).exit_code == 0
    result = runner.invoke(bench_app, ["acceptance", "--dumps", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    write_run(tmp_path / "single", epochs=1)  # no history to replay; group drafts still are
    result = runner.invoke(bench_app, ["acceptance", "--dumps", str(tmp_path / "single"), "--no-arctic",
                                       "--out", str(tmp_path / "o")])
    assert result.exit_code == 0
    assert [p["epochs"] for p in json.loads((tmp_path / "o" / "results.json").read_text())["pairs"]] == ["none->1"]


@pytest.mark.skipif(not arctic_status()[0], reason="arctic-inference is not installed")
def test_drafter_bench_compares_with_arctic_when_it_is_installed(tmp_path: Path) -> None:
    cfg = DrafterBenchConfig(prompts=1, responses=2, length=200, batches=(2,), iterations=3, build_repeats=1,
                             arctic_depths=(8,), quality_units=1)
    results = run_drafter(cfg, tmp_path, QUIET)
    assert "arctic-d8" in results["build"] and "arctic-d8" in results["latency"]
    assert "arctic-d8" in results["quality"]["sources"]
