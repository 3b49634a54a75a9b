"""Other systems' rollout logs as workload traces (`rhymerl trace convert`; docs/formats.md).

Two log classes (docs/formats.md, "Rollout logs of other systems"):

- `verl`: veRL-style logs, one JSONL file per step (`trainer.rollout_data_dir` writes `{step}.jsonl`),
  either one object per response (`input`, `output`, `step`, ...: texts) or packed per-step length
  lists (`response_lengths`, `prompt_lengths`). Token counts are read where the log has them; a
  log of texts needs an explicit tokenizer (`--tokenizer DIR`), never a guess from characters.
  Responses with identical `input` text share a prompt id, across steps too (so ids recur exactly
  when inputs do).
- `agent`: multi-turn agent logs, one object per response with its turns: generated tokens and the
  latency of the tool call after each.

Every file is read whole before anything is written, and every complaint names `file:line` and
the field: a log we do not understand is refused, not half converted.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rhymerl.errors import UserError
from rhymerl.workers.model.tokenizer import Tokenizer
from rhymerl.workers.task.prompts import prompt_id_text
from rhymerl.workers.text_lines import json_line, text_lines

from .io import MAX_LEN, MAX_STEP, MAX_TOOL_S, MAX_TURNS, TraceError, turns_text, write_trace

Source = Literal["verl", "agent"]
SOURCES: tuple[Source, ...] = ("verl", "agent")
MAX_LOG_LINE_BYTES = 1 << 28  # a response's text may be long: 256 MiB, as rollout dumps allow


@dataclass
class Rows:
    """Converted rows: (step, group key or None, input_len, output_len), and turns per row for agents."""

    rows: list[tuple[int, str | None, int, int]] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)
    keyed: set[bool] = field(default_factory=set)
    """Whether rows had a prompt key: both kinds in one log is an error."""


def log_files(paths: list[Path]) -> list[Path]:
    """The JSONL files named, folders expanded to their `*.jsonl` files, by step number when the
    names are numbers (`{step}.jsonl`), else by name."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"), key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit()
                                                                 else 0, p.name))
            if not found:
                raise TraceError(f"{path}: a folder without *.jsonl files")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise TraceError(f"{path}: no such file")
    return files


def _records(path: Path) -> Iterator[tuple[str, dict[str, object]]]:
    """(`file:line`, object) of each non-blank line."""
    try:
        with path.open("rb") as f:
            for lineno, text in text_lines(f, str(path), TraceError, MAX_LOG_LINE_BYTES):
                if not text.strip():
                    continue
                where = f"{path}:{lineno}"
                obj = json_line(text, where, TraceError)
                if not isinstance(obj, dict):
                    raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
                yield where, obj
    except IsADirectoryError:
        raise TraceError(f"{path}: a folder, not a log file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _count(where: str, name: str, value: object, maximum: int, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{where}: {name}: expected an integer, got {value!r:.40}")
    if not least <= value <= maximum:
        raise TraceError(f"{where}: {name}: {value} must lie in {least}..{maximum}")
    return value


def _step(where: str, obj: dict[str, object], path: Path) -> int:
    if "step" in obj:
        return _count(where, "step", obj["step"], MAX_STEP)
    if path.stem.isdigit():
        return _count(where, "step (from the file name)", int(path.stem), MAX_STEP)
    raise TraceError(f"{where}: step: missing, and the file name is not a step number ({{step}}.jsonl)")


def _lengths(where: str, obj: dict[str, object], names: tuple[str, str]) -> list[int] | None:
    """A packed list of token counts under either name, or None when neither is a list."""
    for name in names:
        value = obj.get(name)
        if isinstance(value, list):
            return [_count(f"{where}: {name}[{i}]", "length", v, MAX_LEN) for i, v in enumerate(value)]
    return None


def _verl_line(where: str, obj: dict[str, object], path: Path, tokenizer: Tokenizer | None, out: Rows) -> None:
    step = _step(where, obj, path)
    packed = _lengths(where, obj, ("response_lengths", "response_length"))
    if packed is not None:
        prompts = _lengths(where, obj, ("prompt_lengths", "prompt_length"))
        if prompts is None:
            raise TraceError(f"{where}: prompt_lengths: missing; a packed step needs the prompt length of each response")
        if len(prompts) != len(packed):
            raise TraceError(f"{where}: prompt_lengths: {len(prompts)} lengths for {len(packed)} response_lengths")
        group = obj.get("group_size")
        size = _count(where, "group_size", group, 1 << 20, least=1) if group is not None else 0
        if size and len(packed) % size:
            raise TraceError(f"{where}: group_size: {len(packed)} responses are not whole groups of {size}")
        out.keyed.add(bool(size))
        for i, (inp, length) in enumerate(zip(prompts, packed, strict=True)):
            out.rows.append((step, f"\0s{step}-p{i // size}" if size else None, inp, length))
        return
    text = obj.get("input")
    if text is not None and not isinstance(text, str):
        raise TraceError(f"{where}: input: expected the prompt's text, got {type(text).__name__}")
    inp = _tokens(where, obj, ("prompt_length", "input_len"), "input", tokenizer, prompt=True)
    length = _tokens(where, obj, ("response_length", "output_len"), "output", tokenizer, prompt=False)
    out.keyed.add(text is not None)
    out.rows.append((step, text, inp, length))


def _tokens(where: str, obj: dict[str, object], names: tuple[str, ...], text_field: str, tokenizer: Tokenizer | None,
            prompt: bool) -> int:
    """A token count: the log's own (first of `names`), else the tokenizer's count of the text."""
    for name in names:
        if name in obj:
            return _count(where, name, obj[name], MAX_LEN)
    if tokenizer is None:
        raise TraceError(f"{where}: {names[0]}: missing; this log holds texts, not token counts: pass --tokenizer "
                         f"DIR (the policy's tokenizer folder) to count the tokens of {text_field!r}")
    text = obj.get(text_field)
    if not isinstance(text, str):
        raise TraceError(f"{where}: {text_field}: missing or not text; needed to count {names[0]}")
    try:
        ids = tokenizer.prompt_ids(text) if prompt else tokenizer.encode(text)
    except ValueError as exc:
        raise TraceError(f"{where}: {text_field}: the tokenizer cannot encode it: {exc}") from None
    return _count(where, names[0], len(ids), MAX_LEN)


def _agent_line(where: str, obj: dict[str, object], path: Path, out: Rows) -> None:
    step = _step(where, obj, path)
    if "input_len" not in obj:
        raise TraceError(f"{where}: input_len: missing (prompt tokens)")
    inp = _count(where, "input_len", obj["input_len"], MAX_LEN)
    raw = obj.get("turns")
    if not isinstance(raw, list) or not raw:
        raise TraceError(f"{where}: turns: expected a non-empty list of {{\"tokens\", \"tool_s\"}} objects")
    if len(raw) > MAX_TURNS:
        raise TraceError(f"{where}: turns: {len(raw)} turns; at most {MAX_TURNS}")
    tokens: list[int] = []
    tool_s: list[float] = []
    for k, turn in enumerate(raw):
        at = f"{where}: turns[{k}]"
        if not isinstance(turn, dict):
            raise TraceError(f"{at}: expected an object with tokens and tool_s")
        if "tokens" not in turn:
            raise TraceError(f"{at}: tokens: missing (tokens generated in the turn)")
        tokens.append(_count(at, "tokens", turn["tokens"], MAX_LEN, least=1))
        last = k == len(raw) - 1
        seconds = turn.get("tool_s")
        if seconds is None and not last:
            raise TraceError(f"{at}: tool_s: missing (seconds of the tool call after the turn)")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                                    or not 0.0 <= seconds <= MAX_TOOL_S or math.isnan(seconds)):
            raise TraceError(f"{at}: tool_s: {seconds!r:.40} must be a number in 0..{MAX_TOOL_S:g}")
        tool_s.append(0.0 if last or seconds is None else float(seconds))
    total = sum(tokens)
    if total > MAX_LEN:
        raise TraceError(f"{where}: turns: {total} tokens in all; at most {MAX_LEN}")
    pid = obj.get("prompt_id")
    if pid is not None:
        if not isinstance(pid, str | int) or isinstance(pid, bool):
            raise TraceError(f"{where}: prompt_id: expected a string, got {type(pid).__name__}")
        pid = prompt_id_text(str(pid).strip(), where, TraceError)
    out.keyed.add(pid is not None)
    out.rows.append((step, pid, inp, total))
    out.turns.append(turns_text(tokens, tool_s))


def read_logs(source: Source, paths: list[Path], tokenizer: Tokenizer | None = None) -> Rows:
    """Every response of the logs as trace rows (in file order); raises TraceError naming file:line."""
    if source == "agent" and tokenizer is not None:
        raise TraceError("--tokenizer: agent logs carry token counts; it applies to --from verl only")
    out = Rows()
    for path in log_files(paths):
        for where, obj in _records(path):
            if source == "verl":
                _verl_line(where, obj, path, tokenizer, out)
            else:
                _agent_line(where, obj, path, out)
            if len(out.keyed) > 1:
                raise TraceError(f"{where}: some responses have a prompt (input text, prompt_id or group_size) and "
                                 f"some do not; a log has them on every response or on none")
    if not out.rows:
        raise TraceError(f"{', '.join(map(str, paths))}: no responses in the log")
    return out


def prompt_ids(rows: Rows, source: Source) -> list[str | None]:
    """Trace prompt ids: verl's identical input texts (or packed groups) numbered `pN` by first
    appearance; an agent log's own ids as they are."""
    if source == "agent":
        return [r[1] for r in rows.rows]
    table: dict[str, str] = {}
    return [None if r[1] is None else table.setdefault(r[1], f"p{len(table)}") for r in rows.rows]


def convert(source: Source, paths: list[Path], out: Path, tokenizer_dir: Path | None = None) -> int:
    """Read the logs, then write the trace CSV atomically; returns the row count."""
    tokenizer = None
    if tokenizer_dir is not None:
        from rhymerl.workers.model.tokenizer import load_tokenizer

        try:
            tokenizer = load_tokenizer(tokenizer_dir)
        except (UserError, OSError) as exc:
            raise TraceError(f"--tokenizer {tokenizer_dir}: {exc}") from None
    rows = read_logs(source, paths, tokenizer)
    ids = prompt_ids(rows, source)
    order = sorted(range(len(rows.rows)), key=lambda i: rows.rows[i][0])
    table = [(rows.rows[i][0], ids[i], rows.rows[i][2], rows.rows[i][3]) for i in order]
    return write_trace(out, table, turns=[rows.turns[i] for i in order] if source == "agent" else None)
