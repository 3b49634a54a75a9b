"""A real run killed (SIGKILL) at any phase of a step resumes to exactly what an uninterrupted run
produces: the same tokens, rewards, metrics and weights, no step counted twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cli_runner import SCRIPT, rhymerl
from safetensors import SafetensorError
from safetensors.torch import load_file

from rhymerl.errors import DiskFull
from rhymerl.workers import dumps
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.run_folder.loop_state import LoopState
from rhymerl.workers.run_folder.run_dir import RunDir
from rhymerl.workers.run_folder.step_metrics import deterministic

REPO = Path(__file__).resolve().parents[2]
# 2 prompts per step, 4 prompts, 2 epochs: steps 1-4, a checkpoint after each
TINY = ["--set", "data.num_prompts=4", "--set", "algorithm.prompts_per_step=2", "--set", "algorithm.group_size=4",
        "--set", "algorithm.epochs=2", "--set", "algorithm.max_response_length=64"]


def _env(crash_at: str | None, signal_name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RHYMERL_CRASH")}
    return env | ({"RHYMERL_CRASH_AT": crash_at, "RHYMERL_CRASH_SIGNAL": signal_name} if crash_at else {})


def _start(out: Path, crash_at: str | None = None, signal_name: str = "SIGKILL",
           sets: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "run", str(REPO / "examples" / "quickstart.yaml"), "--out", str(out), *TINY,
                           *(a for s in sets for a in ("--set", s))],
                          capture_output=True, text=True, env=_env(crash_at, signal_name), timeout=600)


def _resume(out: Path, crash_at: str | None = None, signal_name: str = "SIGKILL") -> subprocess.CompletedProcess[str]:
    if crash_at is None:
        return rhymerl("run", "--resume", str(out))
    return subprocess.run([str(SCRIPT), "run", "--resume", str(out)], capture_output=True, text=True,
                          env=_env(crash_at, signal_name), timeout=600)


def _outcome(run: Path) -> tuple[list[object], list[dict[str, object]], dict[str, torch.Tensor]]:
    records = [(r.step, r.prompt_id, r.sample_index, r.response_ids, r.reward, r.policy_version)
               for r in dumps.read_run(run)]
    rows = [deterministic(m) for m in RunDir(run).metrics()]
    weights = load_file(str(RunDir(run).checkpoint_dirs()[-1] / "model.safetensors"))
    return records, rows, weights


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[object], list[dict[str, object]],
                                                                  dict[str, torch.Tensor]]:
    out = tmp_path_factory.mktemp("ref") / "run"
    res = _start(out)
    assert res.returncode == 0, res.stderr
    return _outcome(out)


@pytest.mark.slow
def test_on_sigterm_the_step_runs_to_its_end_is_checkpointed_and_the_resumed_run_ends_as_an_uninterrupted_one(
        tmp_path: Path, reference: tuple[list[object], list[dict[str, object]], dict[str, torch.Tensor]]) -> None:
    out = tmp_path / "run"
    # SIGTERM in step 2's rollout; periodic checkpoints only every 4 steps
    stopped = _start(out, "rollout:2", "SIGTERM", ("checkpoint.every_steps=4",))
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    assert "Traceback" not in stopped.stderr + stopped.stdout
    assert [m["step"] for m in RunDir(out).metrics()] == [1, 2]  # the step it was in ran to its end
    assert [d.name for d in RunDir(out).checkpoint_dirs()] == ["step_000002"]  # saved on the signal
    assert f"Resume with: rhymerl run --resume {out}" in " ".join(stopped.stdout.split())
    assert "stopped on SIGTERM after step 2" in (out / "events.log").read_text()
    resumed = _resume(out)
    assert resumed.returncode == 0, resumed.stderr
    records, rows, weights = _outcome(out)
    ref_records, ref_rows, ref_weights = reference
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows == ref_rows
    assert records == ref_records
    assert all(torch.equal(weights[k], ref_weights[k]) for k in ref_weights)


# Every phase of a step, in the order a run reaches them, each in the run the link before resumed:
# killed (SIGKILL, nothing runs after it) or out of disk (ENOSPC: in a checkpoint's writer, and before a
# dump). A point of step 1 or 2 comes before the checkpoint of that step exists, so the resume of the
# link before reaches it again; the links of step 3 each resume from step 2's checkpoint. The first
# link stops a run before its first step (its folder resumes from step 0).
LINKS = [("rollout:1", "SIGKILL"), ("checkpoint-files:1", "SIGKILL"), ("checkpoint-files:2", "ENOSPC"),
         ("rollout:3", "SIGKILL"), ("train:3", "SIGKILL"), ("dump:3", "ENOSPC"), ("dump:3", "SIGKILL"),
         ("metrics:3", "SIGKILL"), ("checkpoint-files:3", "SIGKILL"), ("checkpoint-manifest:3", "SIGKILL"),
         ("checkpoint-renamed:3", "SIGKILL")]


def _assert_disk_full_line(full: subprocess.CompletedProcess[str], out: Path, full_at: str) -> None:
    """One line naming where, that what was written is intact and how to resume; exit 2."""
    assert full.returncode == 2, (full_at, full.stderr)
    lines = full.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no space left on the disk of "), full.stderr
    assert str(out) in lines[0] and "what was written before is intact" in lines[0]
    assert lines[0].endswith(f"Resume with: rhymerl run --resume {out}")
    if full_at.startswith("checkpoint"):
        step = full_at.rsplit(":", 1)[1]
        assert f"{out / 'checkpoints'} while writing the checkpoint of step {step}" in lines[0]
        assert "needs about" in lines[0]


@pytest.mark.slow
def test_a_run_killed_or_out_of_disk_at_every_phase_in_turn_resumes_each_time_and_ends_as_the_uninterrupted_run(
        tmp_path: Path, reference: tuple[list[object], list[dict[str, object]], dict[str, torch.Tensor]]) -> None:
    out = tmp_path / "run"
    for i, (crash_at, signal_name) in enumerate(LINKS):
        stopped = _start(out, crash_at, signal_name) if i == 0 else _resume(out, crash_at, signal_name)
        assert "Traceback" not in stopped.stderr + stopped.stdout, (crash_at, stopped.stderr)
        if signal_name == "ENOSPC":
            _assert_disk_full_line(stopped, out, crash_at)
        else:
            assert stopped.returncode == -signal.SIGKILL, (crash_at, stopped.stderr)
    resumed = _resume(out)
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr + resumed.stdout
    records, rows, weights = _outcome(out)
    ref_records, ref_rows, ref_weights = reference
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows == ref_rows
    assert records == ref_records
    assert weights.keys() == ref_weights.keys()
    assert all(torch.equal(weights[k], ref_weights[k]) for k in weights)
    assert not list(out.rglob("*.tmp")), "debris of the interrupted writes must be gone"


@pytest.mark.slow
def test_two_resumes_of_one_folder_run_one_at_a_time_and_count_every_step_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _start(out, "rollout:2").returncode == -signal.SIGKILL
    first = subprocess.Popen([str(SCRIPT), "run", "--resume", str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "run.lock").read_text().strip() or str(first.pid) not in (out / "run.lock").read_text():
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    second = _resume(out)
    assert second.returncode == 2
    assert f"pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_interrupting_a_run_says_where_it_stands_and_how_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # 24 steps: the interrupt lands mid-run even when a loaded machine wakes this loop late
    # SIGINT restored: a suite started in the background by a shell inherits it ignored, and an
    # ignored SIGINT never becomes KeyboardInterrupt
    proc = subprocess.Popen([str(SCRIPT), "run", str(REPO / "examples" / "quickstart.yaml"), "--out", str(out),
                             *TINY, "--set", "algorithm.epochs=6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while not RunDir(out).checkpoint_dirs() if out.is_dir() else True:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert f"rhymerl run --resume {out}" in stdout + stderr
    assert "Traceback" not in stdout + stderr
    assert "interrupted" in (out / "events.log").read_text()
    assert _resume(out).returncode == 0


def _stopped_start(out: Path, signal_name: str) -> subprocess.CompletedProcess[str]:
    """A run that sends itself `signal_name` once its roles are set up, before its first step
    (fault point `start`); SIGINT restored, as a terminal's Ctrl-C finds it."""
    return subprocess.run([str(SCRIPT), "run", str(REPO / "examples" / "quickstart.yaml"), "--out", str(out), *TINY],
                          capture_output=True, text=True, env=_env("start:0", signal_name), timeout=600,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.parametrize(("signal_name", "code"), [("SIGTERM", 128 + signal.SIGTERM), ("SIGINT", 130)])
def test_a_start_stopped_by_a_signal_before_its_first_step_leaves_no_folder(
        tmp_path: Path, signal_name: str, code: int) -> None:
    out = tmp_path / "run"
    stopped = _stopped_start(out, signal_name)
    assert stopped.returncode == code, stopped.stderr
    assert "Traceback" not in stopped.stderr + stopped.stdout
    assert not out.exists()
    assert f"removed {out}" in " ".join(stopped.stdout.split())


@pytest.mark.parametrize("error", [
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),  # torch's zip writer
])
def test_a_full_disk_met_by_a_library_writing_a_checkpoint_is_a_disk_full_error(
        tmp_path: Path, tiny_model: TinyLlama, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    from rhymerl.api import RLJob
    from rhymerl.workers.run_folder import run_dir

    run = RunDir(tmp_path / "run")
    run.create(RLJob())

    def fail(*args: object) -> None:
        raise error

    monkeypatch.setattr(run_dir, "save_model", fail)
    # torch's writer does not say why it failed: the space left does
    monkeypatch.setattr(run_dir.shutil, "disk_usage", lambda path: SimpleNamespace(free=10))
    opt = torch.optim.AdamW(tiny_model.parameters())
    with pytest.raises(DiskFull, match=r"while writing the checkpoint of step 3 \(.* it needs about \d"):
        run.save_checkpoint(LoopState(step=3), tiny_model, opt, 2)
    assert not run.checkpoint_dirs() and not list((run.path / "checkpoints").iterdir())


def test_signals_held_while_ray_starts_reach_the_handlers_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from rhymerl.workers.controller.stopping import Terminated, held_signals, stop_signals

    seen: list[str] = []
    with pytest.raises(Terminated), stop_signals():
        with held_signals():
            signal.raise_signal(signal.SIGTERM)
            seen.append("held")  # not cut short
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what a library may install meanwhile
        seen.append("not reached")
    assert seen == ["held"]
