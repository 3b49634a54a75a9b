"""Rollout dumps: one JSONL file per step, one line per sampled response (docs/formats.md).

Dumps are the history the system learns from (speculation drafts, length ranking) and the input of
the acceptance and trace tools, so reading them validates every line and names the bad one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from rhymerl.errors import UserError, user_paths
from rhymerl.workers import atomic
from rhymerl.workers.text_lines import text_lines

DUMP_DIR = "rollouts"
DUMP_GLOB = "step_*.jsonl"
MAX_LINE_BYTES = 256 << 20  # a record of 128K prompt and 128K response token ids is about 2 MB
# every integer fits int64, what numpy and torch hold: a hand-edited dump cannot overflow a reader
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
Ordinal = Annotated[int, Field(ge=1, le=2**63 - 1)]


class SourceStats(BaseModel):
    """One draft source's share of a sample's speculation."""

    model_config = ConfigDict(extra="forbid")
    passes: Count = Field(0, description="passes that verified this source's draft")
    drafted: Count = Field(0, description="its draft tokens verified")
    accepted: Count = Field(0, description="of those, accepted")


class SpeculationStats(BaseModel):
    """Per-sample speculation counters (all zero when speculation was off)."""

    model_config = ConfigDict(extra="forbid")
    drafted: Count = Field(0, description="draft tokens proposed")
    accepted: Count = Field(0, description="draft tokens accepted by verification")
    forward_passes: Count = Field(0, description="decode/verify passes that produced this response")
    sources: dict[str, SourceStats] = Field(
        default_factory=dict, description="drafted and accepted split by the source that drafted them (history, "
        "ngram, ...; fastest-of-n chooses among several per pass); empty in dumps of the vllm engine and before 2026-11-26")


class RolloutRecord(BaseModel):
    # a reward of nan or inf is never written: the loop's guards stop it first (and our reader
    # would reject it)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    step: Ordinal
    epoch: Ordinal
    prompt_id: str
    sample_index: Count = Field(description="index within the prompt's group")
    prompt_len: Count
    prompt_ids: list[Count]
    response_ids: list[Count]
    reward: float
    reward_error: str | None = Field(
        None, description="why the reward function failed on this sample (reward is then reward.failure_reward); "
        "None when it scored")
    finish_reason: Literal["stop", "length"]
    policy_version: Count
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
    """The records of one dump, read as bytes: a line that is not UTF-8, holds a NUL byte, is not JSON
    (nesting too deep included) or not a record is a DumpError naming `file:line`."""
    with user_paths("read", path), path.open("rb") as f:
        for lineno, line in text_lines(f, str(path), DumpError, MAX_LINE_BYTES):
            if not line.strip():
                continue
            try:
                yield RolloutRecord.model_validate_json(line)
            except ValidationError as exc:
                first = exc.errors()[0]
                field = ".".join(str(p) for p in first["loc"]) or "(line)"
                raise DumpError(f"{path}:{lineno}: {field}: {first['msg']}") from None


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
