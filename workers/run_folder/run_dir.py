"""The run folder: resolved spec, metrics, rollout dumps, checkpoints, plots, and its lock.

Layout (docs/formats.md)::

    spec.yaml            the fully resolved RLJob
    job-uid              on a pod: the uid of the RLJob whose run this is (identity.py)
    run.lock             held (flock) by the one process running in this folder
    events.log           what happened to the run beyond its steps (resumes, fallbacks, failures)
    metrics.jsonl        one line per finished step
    rollouts/            step_NNNNNN.jsonl, one line per response (workers/dumps.py)
    checkpoints/         step_NNNNNN/{model.safetensors, config.json, optimizer.pt, state.json,
                         manifest.json} (checkpoints.py)
    plots/metrics.png

Every file is written whole or not at all, checkpoints are verified before they are loaded, and
resuming cuts metrics and dumps back to the checkpoint it loads, so no step is ever counted twice
and none is lost: a step after the checkpoint is simply run again, with the same tokens.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from rhymerl.api import RLJob, dump_job, parse_job
from rhymerl.errors import UserError, disk_full, is_disk_full, plain
from rhymerl.workers import atomic, dumps
from rhymerl.workers.model.policy import PolicyModel, read_weights, save_model, save_weights
from rhymerl.workers.run_folder import checkpoints
from rhymerl.workers.run_folder.identity import JOB_UID_FILE
from rhymerl.workers.run_folder.loop_state import LoopState
from rhymerl.workers.run_folder.run_lock import RunLock
from rhymerl.workers.run_folder.step_metrics import StepMetrics

SPEC = "spec.yaml"
METRICS = "metrics.jsonl"
EVENTS = "events.log"
CHECKPOINTS = "checkpoints"
STATE = "state.json"
OPTIMIZER = "optimizer.pt"
UNRECORDED = ".unrecorded"  # the suffix of a checkpoint set aside for being ahead of the run's records
EXTRA = "extra.json"  # what the train worker keeps beside the loop state (groups a checkpoint left open)


DATA_DIR_ENV = "RHYMERL_DATA_DIR"
POD_RUN_DIR = "run"


def pod_run_dir() -> Path:
    """The run folder of a stateful pod (controller, train): on its data volume."""
    return Path(os.environ[DATA_DIR_ENV]) / POD_RUN_DIR


class RunDirError(UserError):
    """A run folder that cannot be created, read or written; the message names the path."""


def finite_json(row: dict[str, Any]) -> str:
    """One metrics line: non-finite numbers become null, so every line stays valid JSON."""
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v
    return json.dumps({k: clean(v) for k, v in row.items()}, allow_nan=False)


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = RunLock(path)
        self.listeners: list[Callable[[str], None]] = []

    # ---- life cycle -------------------------------------------------------------------------

    def create(self, job: RLJob) -> None:
        """Make a new run folder for `job` and take its lock. Refuses a folder with anything in it.
        A create that fails (a full disk, no permission) removes what it made: the folders it
        created, or in a folder that was there and empty, its lock file."""
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"--out {self.path}: exists and is not a folder")
        if self.path.is_dir() and any(p.name != JOB_UID_FILE for p in self.path.iterdir()):
            raise RunDirError(f"{self.path} is not empty: pass --resume {self.path} or another --out")
        made = _first_missing(self.path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.lock.acquire()
            if any(p.name not in (self.lock.path.name, JOB_UID_FILE) for p in self.path.iterdir()):  # lost a race
                self.lock.release()
                raise RunDirError(f"{self.path} is not empty: pass --resume {self.path} or another --out")
            atomic.write_text(self.path / SPEC, dump_job(job))
        except OSError as exc:
            self._unmake(made)
            raise RunDirError(f"--out {self.path}: cannot write there ({exc.strerror or exc})") from None

    def _unmake(self, made: Path | None) -> None:
        """Undo a failed create that held the lock: `made` is the topmost folder it created."""
        held = self.lock.held
        self.close()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        elif held:
            self.lock.path.unlink(missing_ok=True)

    def open(self) -> RLJob:
        """Take the lock of an existing run folder and read its job back (for --resume)."""
        spec = self.path / SPEC
        if not spec.is_file():
            raise RunDirError(f"{self.path}: no {SPEC}; is this a rhymerl run folder?")
        try:
            self.lock.acquire()
        except OSError as exc:
            raise RunDirError(f"{self.path}: cannot lock the run folder ({exc.strerror or exc})") from None
        return self.load_job()

    def load_job(self) -> RLJob:
        spec = self.path / SPEC
        if not spec.is_file():
            raise RunDirError(f"{self.path}: no {SPEC}; is this a rhymerl run folder?")
        return parse_job(spec.read_bytes(), str(spec))

    def close(self) -> None:
        self.lock.release()

    def discard_if_unstarted(self) -> bool:
        """Remove a folder this process created that holds no finished step (a start that failed),
        so the same --out can be used again. Returns whether it was removed."""
        if not self.lock.held or self.metrics() or checkpoints.complete(self.path / CHECKPOINTS):
            return False
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        return True

    # ---- events -------------------------------------------------------------------------------

    def note(self, message: str) -> None:
        """Record something a user should know about the run (and tell the listeners), as plain text."""
        message = plain(message)
        try:
            with (self.path / EVENTS).open("a") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} {message}\n")
        except OSError:
            pass  # the event still reaches the console; a full disk is reported by the write that needs it
        for listen in self.listeners:
            listen(message)

    # ---- metrics ------------------------------------------------------------------------------

    def append_metrics(self, row: dict[str, Any]) -> None:
        line = finite_json(row) + "\n"
        try:
            with (self.path / METRICS).open("a") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            if is_disk_full(exc):  # a line cut short is not a step (metrics): the step runs again
                raise disk_full(self.path / METRICS, f"the row of step {row.get('step')}", len(line)) from None
            raise

    def step_metrics(self) -> list[StepMetrics]:
        """Finished steps, typed (a row some older version wrote without a field now required fails)."""
        return [StepMetrics.model_validate(row) for row in self.metrics()]

    def metrics(self) -> list[dict[str, Any]]:
        """Finished steps' rows. A last line cut short by a crash (no newline) is not a step."""
        path = self.path / METRICS
        if not path.is_file():
            return []
        text = path.read_text()
        lines = text.split("\n")
        rows = []
        for n, line in enumerate(lines[:-1], 1):  # the part after the last newline is never whole
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise RunDirError(f"{path}:{n}: not JSON ({exc.msg})") from None
        return rows

    # ---- checkpoints --------------------------------------------------------------------------

    def checkpoint_dirs(self) -> list[Path]:
        return checkpoints.complete(self.path / CHECKPOINTS)

    def save_checkpoint(self, state: LoopState, model: PolicyModel, optimizer: torch.optim.Optimizer,
                        keep_last: int, extra: Mapping[str, Any] | None = None,
                        policies: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
                        job: RLJob | None = None) -> Path:
        """policies: more weights the checkpoint keeps, file name -> Hugging Face-named tensors (the
        policy versions a pipelined run had in flight: run_folder/in_flight.py); job: the spec it
        was written under (a resume compares the folder's spec.yaml with it: `spec_change`)."""
        def fill(folder: Path) -> None:
            save_model(model, folder)
            if job is not None:
                (folder / SPEC).write_text(dump_job(job))
            torch.save(optimizer.state_dict(), folder / OPTIMIZER)
            (folder / STATE).write_text(json.dumps(asdict(state)))
            if extra:
                (folder / EXTRA).write_text(json.dumps(extra))
            for name, weights in (policies or {}).items():
                save_weights(weights, folder / name)

        root = self.path / CHECKPOINTS
        try:
            final = checkpoints.write(root, state.step, fill)
            checkpoints.prune(root, keep_last)
        except Exception as exc:  # a full disk fails safetensors and torch's zip writer in their own words
            need = _checkpoint_bytes(model, optimizer)
            if is_disk_full(exc) or _short_of(root, need):
                raise disk_full(root, f"the checkpoint of step {state.step}", need) from None
            if not isinstance(exc, OSError):
                raise
            raise RunDirError(f"{root}: cannot write the checkpoint of step {state.step} "
                              f"({exc.strerror or exc}); free space, then resume with --resume {self.path}") from None
        return final

    def restore(self, model: PolicyModel, optimizer: torch.optim.Optimizer, recorded: int | None = None) -> LoopState:
        """Load the newest intact checkpoint whose steps' records are whole, and cut metrics and
        dumps back to it.

        Debris of interrupted writes is removed; a damaged checkpoint is set aside (renamed
        `step_N.damaged`) and the next older one is tried, as is one newer than the records
        (`recorded`: the steps the loop's metrics.jsonl has rows for, 1..recorded; None: this
        folder's own) or a step's dump (renamed `step_N.unrecorded`: the steps after the one loaded
        run again, with the same tokens, and record themselves anew); with none left the run starts
        over from step 0 (same spec, same seed, so the same tokens)."""
        root = self.path / CHECKPOINTS
        for debris in checkpoints.remove_debris(root):
            self.note(f"removed {debris.name}: left by an interrupted checkpoint write")
        recorded = self.recorded_steps() if recorded is None else recorded
        state = LoopState()
        for folder in reversed(checkpoints.complete(root)):
            if (missing := self._missing_record(checkpoints.step_of(folder) or 0, recorded)) is not None:
                aside = checkpoints.set_aside(folder, UNRECORDED)
                self.note(f"checkpoint {folder.name} is ahead of the run's records ({missing}); set aside as "
                          f"{aside.name}, resuming from an older one: the steps after it run again")
                continue
            try:
                state = self._load(folder, model, optimizer)
                break
            except checkpoints.CheckpointDamaged as exc:
                aside = checkpoints.set_aside(folder)
                self.note(f"checkpoint {folder.name} is damaged ({exc}); set aside as {aside.name}, "
                          "falling back to the next older one")
        else:
            if self.metrics():
                self.note("no intact checkpoint: starting over from step 0")
        self.cut_back(state.step)
        for leftover in self.path.iterdir():
            if atomic.is_temporary(leftover) and leftover.is_file():
                leftover.unlink()
        return state

    def finished(self, epochs: int) -> bool:
        """Whether the run ended: its newest checkpoint is past the last of `epochs` and is its
        newest recorded step (a resume would run nothing). A damaged checkpoint reads as not
        finished; resuming then finds what there is."""
        newest = checkpoints.complete(self.path / CHECKPOINTS)[-1:]
        try:
            state = LoopState.from_json((newest[0] / STATE).read_text()) if newest else None
        except (OSError, ValueError):
            return False
        return state is not None and state.epoch > epochs and state.step == self.recorded_steps()

    def spec_change(self, job: RLJob) -> tuple[str, str] | None:
        """How `job` differs from the spec the newest checkpoint was written under: (its name, a
        unified diff of the resolved specs); None if it does not, or no checkpoint records one."""
        for folder in reversed(self.checkpoint_dirs()):
            saved = folder / SPEC
            if saved.is_file():
                try:
                    before = dump_job(parse_job(saved.read_bytes(), str(saved)))
                except UserError:
                    continue  # damaged: the checksums will say so when it is loaded
                now = dump_job(job)
                if before == now:
                    return None
                diff = difflib.unified_diff(before.splitlines(), now.splitlines(), f"{folder.name}/{SPEC}", SPEC,
                                            lineterm="", n=1)
                return folder.name, "\n".join(diff)
        return None

    def checkpoint_extra(self, step: int) -> dict[str, Any]:
        """What `save_checkpoint(extra=...)` kept with the checkpoint of `step` ({} if nothing, or none)."""
        path = checkpoints.folder(self.path / CHECKPOINTS, step) / EXTRA
        if not path.is_file():
            return {}
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise RunDirError(f"{path}: not a JSON object")
        return data

    def checkpoint_weights(self, step: int, name: str) -> dict[str, torch.Tensor]:
        """Weights kept beside the checkpoint of `step` (save_checkpoint's `policies`); verified with
        the rest of the checkpoint when it was loaded."""
        path = checkpoints.folder(self.path / CHECKPOINTS, step) / name
        try:
            return load_file(str(path))
        except (OSError, SafetensorError) as exc:
            raise RunDirError(f"{path}: not a readable safetensors file ({exc})") from None

    def recorded_steps(self) -> int:
        """The steps metrics.jsonl records in order from step 1 (1..n): a row missing, doubled or
        out of order ends them."""
        n = 0
        for row in self.metrics():
            if row.get("step") != n + 1:
                break
            n += 1
        return n

    def _missing_record(self, step: int, recorded: int) -> str | None:
        """What of the records of steps 1..`step` is missing (None: nothing)."""
        if step > recorded:
            return f"{METRICS} has no row for step {recorded + 1}"
        for s in range(1, step + 1):
            if not (path := dumps.dump_path(self.path, s)).is_file():
                return f"{path.relative_to(self.path)} is missing"
        return None

    def cut_back(self, step: int) -> None:
        """Forget metrics and dumps of steps after `step` (they run again)."""
        kept = self.metrics()[: min(step, self.recorded_steps())]
        atomic.write_text(self.path / METRICS, "".join(finite_json(m) + "\n" for m in kept))
        dumps.remove_after(self.path, step)

    def _load(self, folder: Path, model: PolicyModel, optimizer: torch.optim.Optimizer) -> LoopState:
        try:
            checkpoints.verify(folder)
        except checkpoints.NoManifest:
            self.note(f"checkpoint {folder.name} predates checksums: loaded unverified")
        try:
            state = LoopState.from_json((folder / STATE).read_text())
            weights = read_weights(folder)
            _check_shapes(weights, model)
            opt = torch.load(folder / OPTIMIZER, weights_only=True)
        except Exception as exc:  # verified files that still do not load are damaged all the same
            raise checkpoints.CheckpointDamaged(f"{folder}: {type(exc).__name__}: {exc}") from exc
        model.load_hf_state_dict(weights)
        wanted = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        optimizer.load_state_dict(opt)
        for group, hyper in zip(optimizer.param_groups, wanted, strict=True):  # the spec's, if it changed
            group.update(hyper)
        return state


def _first_missing(path: Path) -> Path | None:
    """The topmost folder of `path` that does not exist yet (what `mkdir(parents=True)` creates first)."""
    missing = None
    for folder in [path, *path.parents]:
        if folder.exists():
            break
        missing = folder
    return missing


def _checkpoint_bytes(model: PolicyModel, optimizer: torch.optim.Optimizer) -> int:
    """About what a checkpoint of `model` and `optimizer` takes on disk: their tensors."""
    tensors = [*model.hf_state_dict().values(),
               *(t for st in optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor))]
    return sum(t.numel() * t.element_size() for t in tensors)


def _short_of(folder: Path, need: int) -> bool:
    """Whether the disk under `folder` has less than `need` bytes free (a write that failed without
    saying why, as torch's zip writer does, failed for want of space)."""
    try:
        return shutil.disk_usage(folder if folder.exists() else folder.parent).free < need
    except OSError:
        return False


def _check_shapes(weights: dict[str, torch.Tensor], model: PolicyModel) -> None:
    """Raise unless `weights` has exactly the model's tensors and shapes (checked before loading, so a
    damaged checkpoint leaves the model as it was)."""
    want = {k: tuple(v.shape) for k, v in model.hf_state_dict().items()}
    have = {k: tuple(v.shape) for k, v in weights.items()}
    if want != have:
        diff = sorted(set(want) ^ set(have)) or sorted(k for k in want if want[k] != have[k])
        raise ValueError(f"weights do not match the model ({', '.join(diff[:3])})")
