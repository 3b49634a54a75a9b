"""The run folder survives crashes: checkpoints are whole or ignored, verified, and locked to one run."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rhymerl.api import RLJob
from rhymerl.errors import UserError
from rhymerl.workers import atomic, dumps
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.run_folder import checkpoints
from rhymerl.workers.run_folder.loop_state import LoopState
from rhymerl.workers.run_folder.run_dir import EVENTS, RunDir, finite_json
from rhymerl.workers.run_folder.run_lock import RunLock, RunLocked


def _run(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.create(RLJob())
    return run


def _save(run: RunDir, model: TinyLlama, step: int, keep_last: int = 5) -> Path:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(step))
    opt = torch.optim.AdamW(model.parameters())
    dumps.write_step(run.path, step, [])
    run.append_metrics({"step": step, "epoch": 1})
    return run.save_checkpoint(LoopState(step=step, cursor=step), model, opt, keep_last, job=RLJob())


def _restore(run: RunDir, model: TinyLlama) -> LoopState:
    return run.restore(model, torch.optim.AdamW(model.parameters()))


def test_a_checkpoint_lists_every_file_with_its_checksum(tmp_path: Path, tiny_model: TinyLlama) -> None:
    folder = _save(_run(tmp_path), tiny_model, 1)
    manifest = json.loads((folder / checkpoints.MANIFEST).read_text())
    assert set(manifest["files"]) == {"model.safetensors", "config.json", "optimizer.pt", "state.json", "spec.yaml"}
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


@pytest.mark.parametrize("fails", ["spec", "lock"])
@pytest.mark.parametrize("there", [False, True])
def test_a_start_that_fails_on_a_full_disk_leaves_nothing_and_the_same_out_starts_next_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str, there: bool) -> None:
    """Whichever write fails (the spec or the lock file), the folders the start made are gone, or in
    a folder that was there and empty, nothing is left in it; the next start takes the same --out."""
    out = tmp_path / "runs" / "run"
    if there:
        out.mkdir(parents=True)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    if fails == "spec":
        monkeypatch.setattr(atomic, "write_text", full)
    else:
        monkeypatch.setattr(RunLock, "acquire", full)
    with pytest.raises(UserError, match="cannot write there"):
        RunDir(out).create(RLJob())
    assert (list(out.iterdir()) == []) if there else not (tmp_path / "runs").exists()
    monkeypatch.undo()
    run = RunDir(out)
    run.create(RLJob())
    assert (out / "spec.yaml").is_file()
    run.close()


def test_out_pointing_at_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(Exception, match="exists and is not a folder"):
        RunDir(tmp_path / "file").create(RLJob())


def test_checkpoints_ahead_of_the_metrics_rows_are_set_aside_and_the_run_resumes_within_its_records(
        tmp_path: Path, tiny_model: TinyLlama) -> None:
    run = _run(tmp_path)
    for step in (1, 2, 3):
        _save(run, tiny_model, step)
    rows = (run.path / "metrics.jsonl").read_text().splitlines()
    (run.path / "metrics.jsonl").write_text(rows[0] + "\n")  # rows of steps 2 and 3 lost
    heard: list[str] = []
    run.listeners.append(heard.append)
    assert _restore(run, tiny_model) == LoopState(step=1, cursor=1)
    assert all(bool((p == 1.0).all()) for p in tiny_model.parameters())
    assert sorted(p.name for p in (run.path / "checkpoints").iterdir()) == [
        "step_000001", "step_000002.unrecorded", "step_000003.unrecorded"]
    assert sum("metrics.jsonl has no row for step 2" in h for h in heard) == 2
    assert not dumps.dump_path(run.path, 2).exists()  # steps 2 and 3 run again and record themselves


def test_a_missing_dump_sends_the_resume_back_to_the_checkpoint_before_its_step(
        tmp_path: Path, tiny_model: TinyLlama) -> None:
    run = _run(tmp_path)
    for step in (1, 2, 3):
        _save(run, tiny_model, step)
    dumps.dump_path(run.path, 2).unlink()
    assert _restore(run, tiny_model).step == 1
    assert [m["step"] for m in run.metrics()] == [1]
    assert "rollouts/step_000002.jsonl is missing" in (run.path / EVENTS).read_text()


def test_a_metrics_row_doubled_or_out_of_order_ends_the_recorded_steps(tmp_path: Path) -> None:
    run = _run(tmp_path)
    for step in (1, 2, 2, 3):
        run.append_metrics({"step": step})
    assert run.recorded_steps() == 2
    run.cut_back(3)
    assert [m["step"] for m in run.metrics()] == [1, 2]


def test_a_restored_optimiser_keeps_its_state_and_takes_the_specs_hyperparameters(
        tmp_path: Path, tiny_model: TinyLlama) -> None:
    run = _run(tmp_path)
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=1e-3, weight_decay=0.1)
    tiny_model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    dumps.write_step(run.path, 1, [])
    run.append_metrics({"step": 1})
    run.save_checkpoint(LoopState(step=1), tiny_model, opt, 2)
    moments = {k: v["exp_avg"].clone() for k, v in enumerate(opt.state.values())}
    fresh = torch.optim.AdamW(tiny_model.parameters(), lr=5e-4, weight_decay=0.0)
    run.restore(tiny_model, fresh)
    assert fresh.param_groups[0]["lr"] == 5e-4 and fresh.param_groups[0]["weight_decay"] == 0.0
    assert all(torch.equal(v["exp_avg"], moments[k]) for k, v in enumerate(fresh.state.values()))


def test_a_spec_changed_since_the_checkpoint_is_refused_with_the_difference_unless_accepted(
        tmp_path: Path, tiny_model: TinyLlama) -> None:
    from rhymerl.cli.local_run import check_spec_change

    run = _run(tmp_path)
    _save(run, tiny_model, 1)
    same = RLJob()
    assert run.spec_change(same) is None
    check_spec_change(run, same, accept=False)
    changed = RLJob.model_validate({"spec": {"algorithm": {"lr": 5e-5}}})
    with pytest.raises(UserError, match="step_000001") as refused:
        check_spec_change(run, changed, accept=False)
    lines = str(refused.value).splitlines()
    assert "-    lr: 0.0001" in lines and "+    lr: 5.0e-05" in lines and "--accept-spec-change" in lines[-1]
    assert not [line for line in lines if line.startswith(("-  ", "+  ")) and "lr:" not in line]
    check_spec_change(run, changed, accept=True)
    assert "--accept-spec-change" in (run.path / EVENTS).read_text()


def test_events_are_written_as_plain_text_without_the_colours_ray_puts_in_its_errors(tmp_path: Path) -> None:
    run = _run(tmp_path)
    heard: list[str] = []
    run.listeners.append(heard.append)
    run.note("lost a Ray worker (\x1b[36m(RolloutWorker pid=7)\x1b[0m \x1b[1;31mRuntimeError\x1b[0m: boom)")
    text = (run.path / EVENTS).read_text()
    assert "\x1b" not in text and text.endswith(" lost a Ray worker ((RolloutWorker pid=7) RuntimeError: boom)\n")
    assert heard == ["lost a Ray worker ((RolloutWorker pid=7) RuntimeError: boom)"]
