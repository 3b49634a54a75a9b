"""The prompt set of a job and the order it is visited in, epoch by epoch.

Prompt ids are stable across epochs (they key the history index and the rollout dumps); each
epoch visits every prompt exactly once, in an order that depends only on (seed, epoch), so a
resumed run visits the same prompts as an uninterrupted one.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from rhymerl.api.spec import DataSpec
from rhymerl.errors import UserError
from rhymerl.workers.task import arith_chain
from rhymerl.workers.text_lines import json_line, text_lines

BUILTIN_PREFIX = "builtin:"
MAX_PROMPT_ID = 256
MAX_LINE_BYTES = 64 << 20  # far past any prompt: 128K tokens are about 1 MB of text
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


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
            for lineno, line in text_lines(f, str(path), DataError, MAX_LINE_BYTES):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                row = json_line(line, where, DataError, parse_int=_int64_or_oversized)
                if not isinstance(row, dict):
                    raise DataError(f"{where}: expected an object with 'prompt' and 'answer'")
                for key in ("prompt", "answer"):
                    if not isinstance(row.get(key), str):
                        raise DataError(f"{where}: '{key}' must be a string")
                pid = prompt_id(row["prompt_id"], where) if "prompt_id" in row else f"line-{lineno}"
                if pid in seen:
                    raise DataError(f"{where}: duplicate prompt_id '{pid}'")
                seen.add(pid)
                prompts.append((lineno, Prompt(pid, row["prompt"], row["answer"])))
    except OSError as exc:
        raise DataError(f"{path}: {exc.strerror or exc}") from None
    if not prompts:
        raise DataError(f"{path}: no prompts")
    return prompts


OVERSIZED = object()
"""What an integer of more than 19 digits reads as: never int64, and never worth converting."""


def _int64_or_oversized(digits: str) -> int | object:
    return int(digits) if len(digits.lstrip("-")) <= 19 else OVERSIZED


def prompt_id(value: object, where: str) -> str:
    """A JSONL `prompt_id` as the string that keys history and dumps: a string of 1 to 256 characters
    without control characters, or an integer that fits int64 (written in decimal)."""
    if value is OVERSIZED or (isinstance(value, int) and not isinstance(value, bool)):
        if not isinstance(value, int) or not -(2**63) <= value < 2**63:
            raise DataError(f"{where}: prompt_id: an integer id must fit in 64 bits (-2**63 to 2**63-1)")
        return str(value)
    if not isinstance(value, str):
        kind = {dict: "an object", list: "an array", float: "a fraction", bool: "true/false"}.get(type(value), "null")
        raise DataError(f"{where}: prompt_id: must be a string or an integer, not {kind}")
    return prompt_id_text(value, where, DataError)


def prompt_id_text(value: str, where: str, error: type[UserError]) -> str:
    """The rule for a prompt id's text wherever one is read (prompt files, workload traces): 1 to
    MAX_PROMPT_ID characters, no control character; else `error` prefixed with `where`."""
    if not 1 <= len(value) <= MAX_PROMPT_ID:
        raise error(f"{where}: prompt_id: {len(value)} characters; must be 1 to {MAX_PROMPT_ID}")
    control = CONTROL.search(value)
    if control:
        raise error(f"{where}: prompt_id: control character U+{ord(control.group()):04X} at position "
                    f"{control.start() + 1}")
    return value


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    order = list(range(n))
    if shuffle:
        random.Random(f"epoch-order:{seed}:{epoch}").shuffle(order)
    return order
