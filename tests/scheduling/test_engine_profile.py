"""`rhymerl bench engine-profile`: the torch engine measured into a profile the simulator loads."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from rhymerl.algorithms.scheduling import RooflineProfile, TableProfile
from rhymerl.cli.bench import bench_app
from rhymerl.tools.bench.schedule import _extrapolation_note
from rhymerl.tools.sim.iteration_profile_file import load_profile
from rhymerl.tools.traces import Trace
from rhymerl.workers.model.transformer import ModelConfig, TinyLlama
from rhymerl.workers.rollout.verify_cost import measure_decode_grid

cli = typer.Typer()
cli.add_typer(bench_app, name="bench")
SMALL = ["--batch-sizes", "1,3", "--contexts", "8,40", "--prefill-tokens", "16", "--rounds", "1"]


def test_the_measured_profile_loads_into_the_simulator_and_prices_more_work_dearer(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["bench", "engine-profile", "--out", str(tmp_path), *SMALL], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    prof = load_profile(tmp_path / "profile.json")
    assert prof.batch_sizes == (1, 3) and prof.context_lens == (8, 40) and prof.max_batch == 3
    assert prof.iteration_time(3, 40) >= prof.iteration_time(1, 40) >= prof.iteration_time(1, 8) > 0
    assert prof.prefill_time(100) > 0
    doc = json.loads((tmp_path / "profile.json").read_text())
    assert doc["engine"] == "torch" and doc["model"] == "builtin:tiny-arith" and "CPU" in doc["device"]
    assert "rhymerl bench engine-profile --out" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "profile.png").stat().st_size > 1000


def test_contexts_beyond_the_models_positions_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "p"
    res = CliRunner().invoke(cli, ["bench", "engine-profile", "--out", str(out), "--contexts", "8,5000"],
                             env={"COLUMNS": "1000"})
    assert res.exit_code == 2
    assert "--contexts: 5000 is beyond the model's 1024 positions" in res.output
    assert not out.exists()


def test_an_axis_out_of_order_is_refused_by_name(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["bench", "engine-profile", "--out", str(tmp_path), "--batch-sizes", "4,2"],
                             env={"COLUMNS": "1000"})
    assert res.exit_code == 2 and "--batch-sizes: values must be strictly increasing" in res.output


def test_the_decode_grid_has_a_cell_per_batch_and_context_and_never_gets_cheaper() -> None:
    model = TinyLlama(ModelConfig(num_hidden_layers=1, max_position_embeddings=64)).eval()
    calls = []
    grid = measure_decode_grid(model, (1, 2, 4), (4, 16), rounds=2, progress=lambda: calls.append(1))
    assert len(grid) == 3 and all(len(row) == 2 for row in grid) and len(calls) == 12
    assert all(grid[i][j] <= grid[i + 1][j] for i in range(2) for j in range(2))
    assert all(row[0] <= row[1] for row in grid)


def test_the_bench_says_how_much_decoding_a_measured_profile_only_extrapolates() -> None:
    prof = TableProfile(batch_sizes=(1, 2), context_lens=(0, 50), seconds=((1.0, 1.0), (1.0, 1.0)),
                        prefill_seconds_per_token=0.0, max_batch=2)
    trace = Trace.from_steps([[("a", 90), ("b", 30)]], input_len=10)
    # a: context 10..100, 50 of its 90 tokens beyond 50; b: context 10..40, none
    assert _extrapolation_note(trace, prof) == [
        "profile: measured up to context 50; 42% of the trace's decoded tokens lie beyond it (up to context 100) "
        "and are priced by extrapolation"]
    assert _extrapolation_note(trace, RooflineProfile()) == []
