"""Load and save iteration profiles measured on a real engine (docs/formats.md, "Iteration profile").

A profile is a grid of seconds per decode iteration over (batch_size, context_len), plus the
prefill cost per token. The simulator and the tier-2 cost model then price work with measured
numbers instead of the default roofline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rhymerl.algorithms.scheduling.costmodel import IterationProfile, RooflineProfile, TableProfile
from rhymerl.errors import UserError

FORMAT = "rhymerl.iteration-profile/v1"


class ProfileError(UserError):
    """A profile file that cannot be used; the message names the file and the field."""


class ProfilePoint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_size: int = Field(gt=0)
    context_len: int = Field(ge=0, description="mean context (prompt + generated tokens) per sequence")
    seconds: float = Field(gt=0.0, description="wall-clock seconds of one decode iteration")


class ProfileFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["rhymerl.iteration-profile/v1"]
    engine: str = Field(description="e.g. 'torch' or 'vllm'")
    model: str = Field(description="model path or name")
    device: str = Field(description="e.g. 'NVIDIA H100 80GB HBM3'")
    dtype: str = "bfloat16"
    notes: str = ""
    max_batch: int = Field(gt=0, description="sequences the engine decodes together at most")
    prefill_seconds_per_token: float = Field(ge=0.0)
    kv_capacity_tokens: int | None = Field(None, gt=0, description="KV-cache tokens a worker holds; omitted: not "
                                           "enforced by the simulator")
    points: list[ProfilePoint] = Field(min_length=4)


def to_table(doc: ProfileFile, where: str) -> TableProfile:
    batches = sorted({p.batch_size for p in doc.points})
    contexts = sorted({p.context_len for p in doc.points})
    grid: dict[tuple[int, int], float] = {}
    for i, p in enumerate(doc.points):
        key = (p.batch_size, p.context_len)
        if key in grid:
            raise ProfileError(f"{where}: points[{i}]: duplicate point batch_size={key[0]}, context_len={key[1]}")
        grid[key] = p.seconds
    missing = [(b, c) for b in batches for c in contexts if (b, c) not in grid]
    if missing:
        b, c = missing[0]
        raise ProfileError(
            f"{where}: points: the grid is incomplete ({len(missing)} missing), e.g. batch_size={b}, context_len={c}; "
            "measure every batch size at every context length"
        )
    if len(batches) < 2 or len(contexts) < 2:
        raise ProfileError(f"{where}: points: need at least 2 batch sizes and 2 context lengths")
    return TableProfile(
        batch_sizes=tuple(batches),
        context_lens=tuple(contexts),
        seconds=tuple(tuple(grid[(b, c)] for c in contexts) for b in batches),
        prefill_seconds_per_token=doc.prefill_seconds_per_token,
        max_batch=doc.max_batch,
        kv_capacity_tokens=doc.kv_capacity_tokens,
    )


def load_profile(path: Path) -> TableProfile:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such file") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
    try:
        doc = ProfileFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]).lstrip(".") or "(file)"
        raise ProfileError(f"{path}: {loc}: {first['msg']}") from None
    return to_table(doc, str(path))


def save_profile(path: Path, doc: ProfileFile) -> Path:
    """Write a profile atomically (for the script that measures the engine)."""
    to_table(doc, str(path))  # refuse to write an unusable grid
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(doc.model_dump_json(indent=2) + "\n", encoding="utf-8")
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    tmp.replace(path)
    return path


def resolve_profile(source: str | Path | None) -> IterationProfile:
    """None or 'roofline': the default H100/7B roofline; otherwise a profile file."""
    if source is None or str(source) == "roofline":
        return RooflineProfile()
    return load_profile(Path(source))
