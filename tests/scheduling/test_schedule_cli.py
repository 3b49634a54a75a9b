"""`rhymerl bench schedule` and `rhymerl trace ...` end to end on small traces."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from rhymerl.cli.bench import bench_app
from rhymerl.cli.trace import trace_app

REPO = Path(__file__).resolve().parents[2]
EXTERNAL = REPO / "benchmarks" / "schedule" / "external_no_ids.csv"
cli = typer.Typer()
cli.add_typer(bench_app, name="bench")


def test_the_bench_runs_a_trace_without_prompt_ids_and_says_history_is_unavailable(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["bench", "schedule", "--trace", str(EXTERNAL), "--workers", "4", "--groups", "2",
                                         "--steps", "2", "--out", str(tmp_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "no prompt_id column" in res.output
    assert "ranked by prompt-length" in res.output
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["trace"]["ids"] == "none" and doc["trace"]["warmup_steps"] == 0
    keys = [r["key"] for r in doc["results"]]
    assert keys[0] == "equal" and "histopipe" in keys
    assert all(r["samples"] == 1024 for r in doc["results"])
    assert (tmp_path / "gantt_histopipe.png").stat().st_size > 1000
    assert (tmp_path / "table.md").read_text().startswith("| policy |")


def test_a_bad_trace_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("step,input_len,output_len\n1,2,3\n1,2,three\n")
    res = CliRunner().invoke(cli, ["bench", "schedule", "--trace", str(bad)], env={"COLUMNS": "1000"})
    assert res.exit_code == 2
    assert f"{bad}:3: output_len" in res.output


def test_trace_export_writes_our_dumps_and_rejects_a_folder_without_them(tmp_path: Path) -> None:
    res = CliRunner().invoke(trace_app, ["export", str(tmp_path), "-o", str(tmp_path / "t.csv")])
    assert res.exit_code == 2
    assert "rollouts/" in res.output
    assert not (tmp_path / "t.csv").exists()


def test_trace_synth_and_stats_report_rank_stability(tmp_path: Path) -> None:
    out = tmp_path / "m.csv"
    assert CliRunner().invoke(trace_app, ["synth", "math", "-o", str(out), "--steps", "17"]).exit_code == 0
    res = CliRunner().invoke(trace_app, ["stats", str(out), "--groups", "8"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "rank stability, 8 groups" in res.output
