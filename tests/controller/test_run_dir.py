"""The run folder survives crashes: checkpoints are whole or ignored, verified, and locked to one run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rhymerl.api import RLJob
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.run_folder import checkpoints
from rhymerl.workers.run_folder.run_dir import EVENTS, LoopState, RunDir, finite_json
from rhymerl.workers.run_folder.run_lock import RunLocked


def _run(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.create(RLJob())
    return run


def _save(run: RunDir, model: TinyLlama, step: int, keep_last: int = 5) -> Path:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(step))
    opt = torch.optim.AdamW(model.parameters())
    run.append_metrics({"step": step, "epoch": 1})
    return run.save_checkpoint(LoopState(step=step, cursor=step), model, opt, keep_last)


def _restore(run: RunDir, model: TinyLlama) -> LoopState:
    return run.restore(model, torch.optim.AdamW(model.parameters()))


def test_a_checkpoint_lists_every_file_with_its_checksum(tmp_path: Path, tiny_model: TinyLlama) -> None:
    folder = _save(_run(tmp_path), tiny_model, 1)
    manifest = json.loads((folder / checkpoints.MANIFEST).read_text())
    assert set(manifest["files"]) == {"model.safetensors", "config.json", "optimizer.pt", "state.json"}
    for name, entry in manifest["files"].items():
        assert entry["sha256"] == checkpoints.sha256(folder / name)
    checkpoints.verify(folder)


def test_an_interrupted_checkpoint_write_is_ignored_and_removed_on_resume(tmp_path: Path,
                                                                          tiny_model: TinyLlama) -> None:
    run = _run(tmp_path)
    _save(run, tiny_model, 1)
    debris = run.path / "checkpoints" / ".step_000002.4242.tmp"
    debris.mkdir()
    (debris / "model.safetensors").write_bytes(b"half")
    run.append_metrics({"step": 2, "epoch": 1})
    assert [p.name for p in run.checkpoint_dirs()] == ["step_000001"]
    state = _restore(run, tiny_model)
    assert state.step == 1 and not debris.exists()
    assert [m["step"] for m in run.metrics()] == [1]
    assert all(bool((p == 1.0).all()) for p in tiny_model.parameters())


@pytest.mark.parametrize("damage", ["truncate-weights", "truncate-state", "delete-optimizer", "bad-manifest"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_older_one_and_says_so(
        tmp_path: Path, tiny_model: TinyLlama, damage: str) -> None:
    run = _run(tmp_path)
    _save(run, tiny_model, 1)
    newest = _save(run, tiny_model, 2)
    target = {"truncate-weights": "model.safetensors", "truncate-state": "state.json",
              "delete-optimizer": "optimizer.pt", "bad-manifest": checkpoints.MANIFEST}[damage]
    if damage == "delete-optimizer":
        (newest / target).unlink()
    else:
        data = (newest / target).read_bytes()
        (newest / target).write_bytes(data[: len(data) // 2])
    heard: list[str] = []
    run.listeners.append(heard.append)
    state = _restore(run, tiny_model)
    assert state == LoopState(step=1, cursor=1)
    assert all(bool((p == 1.0).all()) for p in tiny_model.parameters())
    assert [m["step"] for m in run.metrics()] == [1]
    assert any("step_000002 is damaged" in h for h in heard)
    assert "step_000002 is damaged" in (run.path / EVENTS).read_text()
    assert (run.path / "checkpoints" / "step_000002.damaged").is_dir()
    assert [p.name for p in run.checkpoint_dirs()] == ["step_000001"]


def test_with_no_intact_checkpoint_a_resume_starts_over_and_drops_every_counted_step(
        tmp_path: Path, tiny_model: TinyLlama) -> None:
    run = _run(tmp_path)
    only = _save(run, tiny_model, 1)
    (only / "state.json").write_text("{")
    run.append_metrics({"step": 2, "epoch": 1})
    assert _restore(run, tiny_model) == LoopState()
    assert run.metrics() == []


def test_old_checkpoints_beyond_keep_last_are_removed(tmp_path: Path, tiny_model: TinyLlama) -> None:
    run = _run(tmp_path)
    for step in (1, 2, 3):
        _save(run, tiny_model, step, keep_last=2)
    assert [p.name for p in run.checkpoint_dirs()] == ["step_000002", "step_000003"]


def test_a_metrics_line_cut_short_by_a_crash_is_not_a_step(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.append_metrics({"step": 1, "epoch": 1})
    with (run.path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "ep')
    assert run.metrics() == [{"step": 1, "epoch": 1}]


def test_metrics_lines_are_valid_json_even_when_a_value_is_not_finite() -> None:
    line = finite_json({"step": 1, "loss": float("nan"), "busy": [1.0, float("inf")]})
    assert json.loads(line) == {"step": 1, "loss": None, "busy": [1.0, None]}


def test_a_second_process_cannot_take_a_locked_run_folder_and_is_told_who_holds_it(tmp_path: Path) -> None:
    run = _run(tmp_path)
    probe = ("import sys; from pathlib import Path; from rhymerl.workers.run_folder.run_dir import RunDir\n"
             "try:\n    RunDir(Path(sys.argv[1])).open()\nexcept Exception as e:\n    print(type(e).__name__, e)")
    out = subprocess.run([sys.executable, "-P", "-c", probe, str(run.path)], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("RunLocked") and "pid " in out and "in use" in out
    run.close()
    out = subprocess.run([sys.executable, "-P", "-c", probe, str(run.path)], capture_output=True, text=True,
                         check=True).stdout
    assert out == ""


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.close()
    holder = subprocess.Popen([sys.executable, "-P", "-c",
                               "import sys, time; from pathlib import Path\n"
                               "from rhymerl.workers.run_folder.run_dir import RunDir\n"
                               "r = RunDir(Path(sys.argv[1])); r.open(); print('locked', flush=True); time.sleep(60)",
                               str(run.path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    with pytest.raises(RunLocked, match=f"pid {holder.pid}"):
        RunDir(run.path).open()
    holder.kill()
    holder.wait()
    RunDir(run.path).open()


def test_a_failed_start_leaves_no_folder_behind(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert run.discard_if_unstarted() and not run.path.exists()


def test_out_pointing_at_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(Exception, match="exists and is not a folder"):
        RunDir(tmp_path / "file").create(RLJob())
