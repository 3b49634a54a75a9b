"""The prompt set of a job and the order it is visited in, epoch by epoch.

Prompt ids are stable across epochs (they key the history index and the rollout dumps); each
epoch visits every prompt exactly once, in an order that depends only on (seed, epoch), so a
resumed run visits the same prompts as an uninterrupted one.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from rhymerl.api.spec import DataSpec
from rhymerl.errors import UserError
from rhymerl.workers.task import arith_chain

BUILTIN_PREFIX = "builtin:"


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    text: str
    answer: str


class DataError(UserError):
    """A prompt file that cannot be used; the message names the file and line."""


def load_prompts(spec: DataSpec) -> list[Prompt]:
    return [p for _, p in located_prompts(spec)]


def located_prompts(spec: DataSpec) -> list[tuple[str, Prompt]]:
    """Every prompt with where it comes from: `file:line` for a JSONL source, the prompt id for a builtin one."""
    if spec.source == "builtin:arith-chain":
        problems = arith_chain.generate(spec.num_prompts, spec.seed, spec.min_ops, spec.median_ops, spec.max_ops)
        return [(f"{spec.source} prompt {p.prompt_id}", Prompt(p.prompt_id, p.prompt, p.answer)) for p in problems]
    if spec.source.startswith(BUILTIN_PREFIX):
        raise DataError(f"data.source: unknown builtin '{spec.source}' (known: builtin:arith-chain)")
    path = Path(spec.source)
    return [(f"{path}:{lineno}", p) for lineno, p in read_jsonl_lines(path)]


def read_jsonl(path: Path) -> list[Prompt]:
    return [p for _, p in read_jsonl_lines(path)]


def read_jsonl_lines(path: Path) -> list[tuple[int, Prompt]]:
    """(line number, prompt) of every prompt in a JSONL file; DataError names the file and line."""
    if not path.is_file():
        raise DataError(f"data.source: no such file {path}")
    prompts: list[tuple[int, Prompt]] = []
    seen: set[str] = set()
    try:
        with path.open("rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(f"{path}:{lineno}: not UTF-8: byte 0x{raw[exc.start]:02x} at column "
                                    f"{exc.start + 1}") from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{lineno}: not JSON: {exc.msg}") from exc
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{lineno}: expected an object with 'prompt' and 'answer'")
                for key in ("prompt", "answer"):
                    if not isinstance(row.get(key), str):
                        raise DataError(f"{path}:{lineno}: '{key}' must be a string")
                pid = str(row.get("prompt_id", f"line-{lineno}"))
                if pid in seen:
                    raise DataError(f"{path}:{lineno}: duplicate prompt_id '{pid}'")
                seen.add(pid)
                prompts.append((lineno, Prompt(pid, row["prompt"], row["answer"])))
    except OSError as exc:
        raise DataError(f"{path}: {exc.strerror or exc}") from None
    if not prompts:
        raise DataError(f"{path}: no prompts")
    return prompts


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    order = list(range(n))
    if shuffle:
        random.Random(f"epoch-order:{seed}:{epoch}").shuffle(order)
    return order
