"""The prompt set of a job and the order it is visited in, epoch by epoch.

Prompt ids are stable across epochs (they key the history index and the rollout dumps); each
epoch visits every prompt exactly once, in an order that depends only on (seed, epoch), so a
resumed run visits the same prompts as an uninterrupted one.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rhymerl.api.inputs import DataSpec
from rhymerl.errors import UserError
from rhymerl.workers.model.chat_template import Message
from rhymerl.workers.model.tokenizer import Tokenizer
from rhymerl.workers.task import arith_chain, word_problems
from rhymerl.workers.task.rows import NONE_HELP, extras, is_table, read_prompt, table_rows
from rhymerl.workers.text_lines import json_line, text_lines

BUILTIN_PREFIX = "builtin:"
BUILTINS = ("builtin:arith-chain", "builtin:word-problems")
MAX_PROMPT_ID = 256
MAX_LINE_BYTES = 64 << 20  # far past any prompt: 128K tokens are about 1 MB of text
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    text: str  # a chat prompt's last user message, for display: the model reads `messages` rendered
    answer: str
    messages: tuple[Message, ...] | None = None
    data_source: str | None = None
    extra_info: dict[str, Any] | None = field(default=None, hash=False)

    def reward_extras(self) -> dict[str, Any]:
        """The keyword arguments a reward function may ask for: those the row had."""
        found = {"data_source": self.data_source, "extra_info": self.extra_info}
        return {k: v for k, v in found.items() if v is not None}


class DataError(UserError):
    """A prompt file that cannot be used; the message names the file and line."""


def load_prompts(spec: DataSpec) -> list[Prompt]:
    return [p for _, p in located_prompts(spec)]


def located_prompts(spec: DataSpec) -> list[tuple[str, Prompt]]:
    """Every prompt with where it comes from: `file:line` for a JSONL source, the prompt id for a builtin one."""
    if spec.source.startswith(BUILTIN_PREFIX):
        located = builtin_prompts(spec)
    else:
        path = Path(spec.source)
        located = read_table(path) if is_table(path) else [
            (f"{path}:{lineno}", p) for lineno, p in read_jsonl_lines(path)]
    if spec.chat_template == "none":
        chat = next((where for where, p in located if p.messages is not None), None)
        if chat is not None:
            raise DataError(f"{chat}: {NONE_HELP}")
    return located


def builtin_prompts(spec: DataSpec) -> list[tuple[str, Prompt]]:
    """A generated source's prompts, each located by its id."""
    if spec.source == "builtin:arith-chain":
        chains = arith_chain.generate(spec.num_prompts, spec.seed, spec.min_ops, spec.median_ops, spec.max_ops)
        prompts = [Prompt(p.prompt_id, p.prompt, p.answer) for p in chains]
    elif spec.source == "builtin:word-problems":
        problems = word_problems.generate(spec.num_prompts, spec.seed, spec.split)
        prompts = [Prompt(p.prompt_id, p.question, p.answer, tuple((m["role"], m["content"]) for m in p.messages()))
                   for p in problems]
    else:
        raise DataError(f"data.source: unknown builtin '{spec.source}' (known: {', '.join(BUILTINS)})")
    return [(f"{spec.source} prompt {p.prompt_id}", p) for p in prompts]


def _row_prompt(row: dict[str, Any], where: str, default_id: str, seen: set[str]) -> Prompt:
    text, messages, answer = read_prompt(row, where, DataError)
    data_source, extra_info = extras(row, where, DataError)
    if "prompt_id" in row:
        pid = prompt_id(row["prompt_id"], where)
    elif extra_info is not None and extra_info.get("index") is not None:
        pid = prompt_id(extra_info["index"], f"{where}: extra_info.index")
    else:
        pid = default_id
    if pid in seen:
        raise DataError(f"{where}: duplicate prompt_id '{pid}'")
    seen.add(pid)
    return Prompt(pid, text, answer, messages, data_source, extra_info)


def read_table(path: Path) -> list[tuple[str, Prompt]]:
    """(`file: row N`, prompt) of every row of a parquet/arrow file or a `save_to_disk` folder."""
    if not path.exists():
        raise DataError(f"data.source: no such file {path}")
    seen: set[str] = set()
    located = [(f"{f}: row {n}", _row_prompt(row, f"{f}: row {n}", f"row-{n}", seen))
               for f, n, row in table_rows(path, DataError)]
    if not located:
        raise DataError(f"{path}: no prompts")
    return located


def prompt_text(tok: Tokenizer, prompt: Prompt) -> str:
    """The text the model reads for `prompt`: a chat prompt rendered by the model's template."""
    if prompt.messages is None:
        return prompt.text
    if tok.chat_template is None:
        raise DataError("data.chatTemplate: auto, but the model has no chat template (no chat_template.jinja nor "
                        "tokenizer_config.json chat_template) to render chat messages; give the prompt as a string")
    try:
        return tok.chat_template.render(prompt.messages)
    except ValueError as exc:
        raise DataError(str(exc)) from None


def prompt_tokens(tok: Tokenizer, prompt: Prompt) -> list[int]:
    """What the model reads for `prompt`. A string prompt gets the special tokens the model puts first;
    a rendered chat template already wrote them, so its text is encoded as it is (no second BOS)."""
    if prompt.messages is None:
        return tok.prompt_ids(prompt.text)
    return tok.encode(prompt_text(tok, prompt))


def encode_prompts(tok: Tokenizer, prompts: Sequence[Prompt]) -> dict[str, list[int]]:
    return {p.prompt_id: prompt_tokens(tok, p) for p in prompts}


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
                prompts.append((lineno, _row_prompt(row, where, f"line-{lineno}", seen)))
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
