"""The run folder: resolved spec, metrics, rollout dumps, checkpoints, plots.

Layout (docs/formats.md)::

    spec.yaml            the fully resolved RLJob
    metrics.jsonl        one line per finished step
    rollouts/            step_NNNNNN.jsonl, one line per response (workers/dumps.py)
    checkpoints/         step_NNNNNN/{model.safetensors, config.json, optimizer.pt, state.json}
    plots/metrics.png

Every file is written whole or not at all (temporary name, then rename), and resuming cuts
metrics and dumps back to the checkpoint so no step is ever counted twice.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rhymerl.api import RLJob, dump_job, parse_job
from rhymerl.workers import dumps
from rhymerl.workers.model.transformer import TinyLlama, load_model, save_model

SPEC = "spec.yaml"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"


@dataclass
class LoopState:
    """Where the loop is: the last finished step and the next prompt to visit."""

    step: int = 0
    epoch: int = 1
    cursor: int = 0
    policy_version: int = 0


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    def create(self, job: RLJob) -> None:
        if self.path.exists() and any(self.path.iterdir()):
            raise FileExistsError(f"{self.path} is not empty: pass --resume {self.path} or another --out")
        self.path.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path / SPEC, dump_job(job))

    def load_job(self) -> RLJob:
        spec = self.path / SPEC
        if not spec.is_file():
            raise FileNotFoundError(f"{self.path}: no {SPEC}; is this a rhymerl run folder?")
        return parse_job(spec.read_text(), str(spec))

    def append_metrics(self, row: dict[str, Any]) -> None:
        with (self.path / METRICS).open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def metrics(self) -> list[dict[str, Any]]:
        path = self.path / METRICS
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def checkpoint_dirs(self) -> list[Path]:
        root = self.path / CHECKPOINTS
        return sorted(p for p in root.glob("step_*") if p.is_dir()) if root.is_dir() else []

    def save_checkpoint(self, state: LoopState, model: TinyLlama, optimizer: torch.optim.Optimizer,
                        keep_last: int) -> Path:
        final = self.path / CHECKPOINTS / f"step_{state.step:06d}"
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_model(model, tmp)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps(asdict(state)))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in self.checkpoint_dirs()[:-keep_last]:
            shutil.rmtree(old)
        return final

    def restore(self, model: TinyLlama, optimizer: torch.optim.Optimizer) -> LoopState:
        """Load the newest checkpoint (if any) and cut metrics and dumps back to it."""
        ckpts = self.checkpoint_dirs()
        state = LoopState()
        if ckpts:
            latest = ckpts[-1]
            model.load_state_dict(load_model(latest).state_dict())
            optimizer.load_state_dict(torch.load(latest / "optimizer.pt", weights_only=True))
            state = LoopState(**json.loads((latest / "state.json").read_text()))
        kept = [m for m in self.metrics() if m["step"] <= state.step]
        _atomic_write(self.path / METRICS, "".join(json.dumps(m) + "\n" for m in kept))
        dumps.remove_after(self.path, state.step)
        return state
