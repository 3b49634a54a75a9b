"""Rollout dumps: one JSONL file per step, one line per sampled response (docs/formats.md).

Dumps are the history the system learns from (speculation drafts, length ranking) and the input of
the acceptance and trace tools, so reading them validates every line and names the bad one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from rhymerl.errors import UserError
from rhymerl.workers import atomic

DUMP_DIR = "rollouts"
DUMP_GLOB = "step_*.jsonl"


class SpeculationStats(BaseModel):
    """Per-sample speculation counters (all zero when speculation was off)."""

    model_config = ConfigDict(extra="forbid")
    drafted: int = Field(0, ge=0, description="draft tokens proposed")
    accepted: int = Field(0, ge=0, description="draft tokens accepted by verification")
    forward_passes: int = Field(0, ge=0, description="decode/verify passes that produced this response")


class RolloutRecord(BaseModel):
    # a reward of nan or inf is never written: the loop's guards stop it first (and our reader
    # would reject it)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    step: int = Field(ge=1)
    epoch: int = Field(ge=1)
    prompt_id: str
    sample_index: int = Field(ge=0, description="index within the prompt's group")
    prompt_len: int = Field(ge=0)
    prompt_ids: list[int]
    response_ids: list[int]
    reward: float
    reward_error: str | None = Field(
        None, description="why the reward function failed on this sample (reward is then reward.failure_reward); "
        "None when it scored")
    finish_reason: Literal["stop", "length"]
    policy_version: int = Field(ge=0)
    # dumps written before 2026-11-24 call this field `spec`
    speculation: SpeculationStats = Field(default_factory=SpeculationStats,
                                          validation_alias=AliasChoices("speculation", "spec"))


class DumpError(UserError):
    """A dump file or line that cannot be read; the message names the file and line."""


def dump_path(run_dir: Path, step: int) -> Path:
    return run_dir / DUMP_DIR / f"step_{step:06d}.jsonl"


def write_step(run_dir: Path, step: int, records: Iterable[RolloutRecord]) -> Path:
    """Write one step's dump atomically: a crash leaves either the whole file or none."""
    path = dump_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic.open_atomic(path) as f:
        for rec in records:
            f.write(rec.model_dump_json() + "\n")
    return path


def read_file(path: Path) -> Iterator[RolloutRecord]:
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield RolloutRecord.model_validate_json(line)
            except ValidationError as exc:
                first = exc.errors()[0]
                field = ".".join(str(p) for p in first["loc"]) or "(line)"
                raise DumpError(f"{path}:{lineno}: {field}: {first['msg']}") from exc


def step_files(run_dir: Path) -> list[Path]:
    folder = run_dir / DUMP_DIR
    if not folder.is_dir():
        raise DumpError(f"{run_dir}: no {DUMP_DIR}/ folder with rollout dumps")
    return sorted(folder.glob(DUMP_GLOB))


def read_run(run_dir: Path) -> list[RolloutRecord]:
    """Every record of a run, in step order."""
    return [rec for path in step_files(run_dir) for rec in read_file(path)]


def by_epoch(records: Iterable[RolloutRecord]) -> dict[int, list[RolloutRecord]]:
    out: dict[int, list[RolloutRecord]] = {}
    for rec in records:
        out.setdefault(rec.epoch, []).append(rec)
    return dict(sorted(out.items()))


def remove_after(run_dir: Path, step: int) -> None:
    """Drop dumps of steps later than `step` (used by --resume so no sample is counted twice)."""
    folder = run_dir / DUMP_DIR
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        debris = atomic.is_temporary(path) or path.name.endswith(".tmp")
        later = path.match(DUMP_GLOB) and int(path.name.split(".")[0].removeprefix("step_")) > step
        if debris or later:
            path.unlink()
