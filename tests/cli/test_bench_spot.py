"""`rhymerl bench spot` on a tiny fleet: its table, JSON and plot, the search mode, and bad options."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import rhymerl


def test_bench_spot_writes_a_row_per_fleet_with_no_sample_lost(tmp_path: Path) -> None:
    res = rhymerl("bench", "spot", "--gpus", "2", "--trace", "synthetic:search-agent", "--steps", "2",
                  "--prompts-per-gpu", "1", "--preemptions", "50", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    table = (tmp_path / "table.md").read_text()
    assert all(f"| {fleet} |" in table for fleet in ("fixed on-demand", "fixed spot", "elastic spot"))
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["samples_lost"] for r in runs] == [0, 0, 0]
    assert runs[0]["preemptions"] == 0 and runs[1]["preemptions"] > 0  # 50 per GPU-hour: some within the run
    assert (tmp_path / "spot.png").stat().st_size > 0


def test_bench_spot_search_compares_the_recommendation_with_every_fixed_size(tmp_path: Path) -> None:
    res = rhymerl("bench", "spot", "--search", "--gpus", "3", "--trace", "synthetic:math", "--steps", "2",
                  "--prompts-per-gpu", "1", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert sorted(row["rollout_s"]) == ["1", "2", "3"] and 1 <= row["best"] <= 3
    assert (tmp_path / "fleet-size.png").stat().st_size > 0


def test_bench_spot_refuses_a_search_over_several_sizes() -> None:
    res = rhymerl("bench", "spot", "--search", "--gpus", "2,4")
    assert res.returncode == 2 and "--search" in res.stderr and "Traceback" not in res.stderr
