"""`rhymerl bench replicas` end to end: scheduling policies over real engine replicas, tokens identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import rhymerl


def test_bench_replicas_times_each_policy_on_real_replicas_with_identical_tokens(tiny_run: Path,
                                                                                 tmp_path: Path) -> None:
    out = tmp_path / "bench"
    res = rhymerl("bench", "replicas", "--run", str(tiny_run), "--replicas", "2", "--groups", "2",
                  "--policies", "equal,lpt,histopipe", "--out", str(out))
    assert res.returncode == 0, res.stderr
    result = json.loads((out / "results.json").read_text())
    rows = {r["policy"]: r for r in result["rows"]}
    assert list(rows) == ["equal", "lpt", "histopipe"]
    assert result["samples"] == 16 and result["steps"] == 2
    assert all(r["identical"] for r in rows.values())
    assert rows["equal"]["vs_equal"] == 1.0
    for r in rows.values():
        assert len(r["per_step_makespan_s"]) == 2 and min(r["per_step_makespan_s"]) > 0
        # both are rounded to the millisecond, the sum from unrounded steps
        assert r["makespan_s"] == pytest.approx(sum(r["per_step_makespan_s"]), abs=1e-3 * len(r["per_step_makespan_s"]))
        assert 0.0 <= r["bubble"] < 1.0
    # the run's dumps are the history HistoPipe ranks by; lpt plans with the true lengths
    assert rows["histopipe"]["ranking"] == ["history"] and rows["lpt"]["ranking"] == ["oracle"]
    for name in ("table.md", "makespan.png"):
        assert (out / name).stat().st_size > 0


def test_bench_replicas_names_an_unknown_policy(tmp_path: Path) -> None:
    res = rhymerl("bench", "replicas", "--run", str(tmp_path), "--policies", "equal,fifo")
    assert res.returncode == 2
    assert "--policies: unknown ['fifo']" in res.stderr


def test_bench_replicas_runs_each_policy_with_the_relay_on_and_off_as_a_first_epoch(tiny_run: Path,
                                                                                   tmp_path: Path) -> None:
    out = tmp_path / "bench"
    res = rhymerl("bench", "replicas", "--run", str(tiny_run), "--replicas", "2", "--policies", "histopipe",
                  "--relay", "both", "--first-epoch", "--out", str(out))
    assert res.returncode == 0, res.stderr
    result = json.loads((out / "results.json").read_text())
    rows = {r["policy"]: r for r in result["rows"]}
    assert list(rows) == ["histopipe, relay on", "histopipe, relay off"]
    assert [(r["scheduler"], r["relay"]) for r in rows.values()] == [("histopipe", True), ("histopipe", False)]
    assert result["first_epoch"] and all(r["identical"] for r in rows.values())
    # as a first epoch: no length history to rank by, and the group the only draft source
    assert all(r["ranking"] == ["prompt-length"] and r["tokens_per_pass"] >= 1.0 for r in rows.values())


def test_bench_replicas_names_a_relay_it_does_not_know(tmp_path: Path) -> None:
    res = rhymerl("bench", "replicas", "--run", str(tmp_path), "--relay", "sometimes")
    assert res.returncode == 2
    assert "--relay: 'sometimes'; one of on, off, both" in res.stderr
