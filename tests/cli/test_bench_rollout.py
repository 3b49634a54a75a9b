"""`rhymerl bench rollout` end to end on a tiny finished run: every workload and method, outputs identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import rhymerl

from rhymerl.api.spec import SpeculationSpec
from rhymerl.tools.bench.rollout import _sources, method_spec
from rhymerl.workers.history.store import MemoryHistoryStore
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


def test_bench_rollout_names_a_bad_workload(tmp_path: Path) -> None:
    res = rhymerl("bench", "rollout", "--run", str(tmp_path), "--batch-sizes", "job,eight")
    assert res.returncode == 2
    assert "--batch-sizes: 'eight'" in res.stderr


def test_each_history_method_drafts_with_its_own_knobs() -> None:
    job = SpeculationSpec()
    stores = {w: MemoryHistoryStore(reward_weighted=w) for w in (True, False)}
    knobs = {}
    for method in ("history", "history-paper", "history-mismatched-fixed"):
        spec = method_spec(method, job)
        source = _sources(method, spec, stores, 1, ["p"], DraftCapController(spec))
        assert isinstance(source, HistoryDrafts)
        native = source.drafter._native
        knobs[method] = (native.prefix_max, native.prefix_min, native.min_prob, spec.disable_above_batch)
    assert knobs["history"] == (job.prefix.max, job.prefix.min, job.min_prob, None)
    assert knobs["history-paper"] == (7, 3, 0.0, None)
    assert knobs["history-mismatched-fixed"][:3] == knobs["history"][:3]
    assert knobs["history-mismatched-fixed"][3] is not None
