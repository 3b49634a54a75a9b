"""Read and write workload trace CSVs (docs/formats.md, "Workload trace CSV").

Files come from other systems, so reading is strict and every complaint names the file, the line
and the column, and every number is bounded. Traces run to millions of rows, so a file is read as a
stream of bounded lines into typed columns (tens of bytes a row, not a Python object per cell) and
reports how far it got. Writing is atomic: a failed export leaves no half-written file behind.
"""

from __future__ import annotations

import csv
import math
import os
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

import numpy as np

from rhymerl.errors import UserError, user_paths
from rhymerl.workers.task.prompts import prompt_id_text
from rhymerl.workers.text_lines import text_lines

from .model import PromptIds, Trace, Turns

REQUIRED = ("step", "input_len", "output_len")
OPTIONAL = ("prompt_id", "turns")
HEADER = ("step", "prompt_id", "input_len", "output_len")


class TraceError(UserError):
    """A trace that cannot be read; the message names the file and line."""


MAX_LEN = 1 << 24  # tokens of one prompt or response: 16M, past every model's context
MAX_STEP = 10**9
MAX_LINE_BYTES = 1 << 20
MAX_TURNS = 4096
MAX_TOOL_S = 86400.0  # one tool call: a day
PROGRESS_ROWS = 1 << 16
DIGITS = re.compile(r"[+-]?[0-9]+")

Progress = Callable[[int, int], None]
"""Called now and then while a file is read, with (bytes read, bytes in the file)."""


def _shown(text: str, quote: bool = True) -> str:
    if len(text) > 40:
        return f"{text[:20]!r}... ({len(text)} characters)" if quote else f"{text[:20]}... ({len(text)} digits)"
    return repr(text) if quote else text


def _int(path: Path | str, lineno: int, column: str, text: str, maximum: int) -> int:
    """A cell that is not plain digits within [0, maximum]: its value, or a TraceError saying why not."""
    text = text.strip()
    if not text:
        raise TraceError(f"{path}:{lineno}: {column}: empty, expected a non-negative integer")
    if not DIGITS.fullmatch(text):
        raise TraceError(f"{path}:{lineno}: {column}: {_shown(text)} is not an integer")
    if text.startswith("-") and text.strip("-0"):
        raise TraceError(f"{path}:{lineno}: {column}: {_shown(text, quote=False)} is negative")
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > len(str(maximum)) or int(digits or "0") > maximum:
        raise TraceError(f"{path}:{lineno}: {column}: {_shown(text, quote=False)} is over the maximum {maximum}")
    return int(digits or "0")


def _cell(text: str, maximum: int) -> int:
    """Plain digits within [0, maximum] (nearly every cell), else -1."""
    if text.isdigit() and text.isascii() and len(text) <= 18:
        value = int(text)
        if value <= maximum:
            return value
    return -1


def _prompt_id(path: Path | str, lineno: int, text: str) -> str:
    pid = text.strip()
    if not pid:
        raise TraceError(f"{path}:{lineno}: prompt_id: empty; leave the column out when responses have no prompt id")
    return prompt_id_text(pid, f"{path}:{lineno}", TraceError)


def turns_text(tokens: list[int], tool_s: list[float]) -> str:
    """A row's `turns` cell: `TOKENS:SECONDS` per turn followed by a tool call, the last turn's `TOKENS`
    alone (`300:1.25 200:0.8 150`); a single-turn row's cell is empty."""
    if len(tokens) <= 1:
        return ""
    return " ".join([*(f"{t}:{s:g}" for t, s in zip(tokens[:-1], tool_s[:-1], strict=True)), str(tokens[-1])])


def parse_turns(path: Path | str, lineno: int, text: str, output_len: int) -> list[tuple[int, float]]:
    """A `turns` cell as (tokens, tool seconds) per turn; empty: one turn of `output_len` tokens."""
    parts = text.split()
    if not parts:
        return [(output_len, 0.0)]
    if len(parts) > MAX_TURNS:
        raise TraceError(f"{path}:{lineno}: turns: {len(parts)} turns; at most {MAX_TURNS}")
    turns: list[tuple[int, float]] = []
    for k, part in enumerate(parts, start=1):
        tok, sep, sec = part.partition(":")
        tokens = _int(path, lineno, f"turns (turn {k})", tok, MAX_LEN)
        if tokens == 0 and len(parts) > 1:
            raise TraceError(f"{path}:{lineno}: turns (turn {k}): 0 tokens; a turn generates at least one")
        if k == len(parts):
            if sep:
                raise TraceError(f"{path}:{lineno}: turns: the last turn {part!r} has a tool call; the last turn "
                                 f"ends the response (write its tokens alone)")
            turns.append((tokens, 0.0))
            continue
        if not sep:
            raise TraceError(f"{path}:{lineno}: turns (turn {k}): {_shown(part)} lacks ':SECONDS', the latency of "
                             f"the tool call after it")
        try:
            seconds = float(sec)
        except ValueError:
            seconds = math.nan
        if not 0.0 <= seconds <= MAX_TOOL_S:
            raise TraceError(f"{path}:{lineno}: turns (turn {k}): tool seconds {_shown(sec)} must be a number in "
                             f"0..{MAX_TOOL_S:g}")
        turns.append((tokens, seconds))
    total = sum(t for t, _ in turns)
    if total != output_len:
        raise TraceError(f"{path}:{lineno}: turns: the turns' tokens sum to {total}, output_len is {output_len}")
    return turns


def _records(lines: Iterable[str], path: Path | str) -> Iterator[tuple[int, list[str]]]:
    """The CSV rows of `lines` with their line numbers, blank and comment rows left out."""
    reader = csv.reader(lines)
    while True:
        try:
            row = next(reader, None)
        except csv.Error as exc:
            reason = f"a field longer than {csv.field_size_limit()} characters" if "field limit" in str(exc) else exc
            raise TraceError(f"{path}:{reader.line_num}: not CSV: {reason}") from None
        if row is None:
            return
        if not row or row[0].lstrip().startswith("#") or all(not cell.strip() for cell in row):
            continue
        yield reader.line_num, row


def _header(path: Path | str, lineno: int, row: list[str]) -> tuple[list[str], dict[str, int]]:
    """A header row's column names, and where each known column is; a TraceError for duplicate or
    missing columns."""
    header = [c.strip().lower() for c in row]
    dupes = sorted({c for c in header if header.count(c) > 1})
    if dupes:
        raise TraceError(f"{path}:{lineno}: header: duplicate column(s) {', '.join(dupes)}")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise TraceError(
            f"{path}:{lineno}: header: missing column(s) {', '.join(missing)}; "
            f"expected {','.join(HEADER)} (prompt_id optional), got {','.join(header)}"
        )
    return header, {c: header.index(c) for c in (*REQUIRED, *OPTIONAL) if c in header}


class _Columns:
    """The rows read so far under one header, in typed arrays (eight bytes a cell), prompt ids as
    codes into a table of the distinct ids."""

    def __init__(self, path: Path | str, header: list[str], col: dict[str, int], header_line: int) -> None:
        self.path = path
        self.header, self.col, self.header_line = header, col, header_line
        self.width = len(header)
        self.cs, self.ci, self.co = col["step"], col["input_len"], col["output_len"]
        self.cp, self.ct = col.get("prompt_id", -1), col.get("turns", -1)
        self.steps, self.inputs, self.outputs, self.codes = array("q"), array("q"), array("q"), array("q")
        self.table: dict[str, int] = {}
        self.names: list[str] = []
        self.turns: list[list[tuple[int, float]]] = []

    def read(self, records: Iterator[tuple[int, list[str]]], tick: Callable[[], None] | None) -> None:
        """The data rows, each checked (a TraceError names the line and the field); `tick` is called
        every PROGRESS_ROWS rows."""
        path, width, cs, ci, co, cp, ct = self.path, self.width, self.cs, self.ci, self.co, self.cp, self.ct
        steps, inputs, outputs, codes, table = self.steps, self.inputs, self.outputs, self.codes, self.table
        for lineno, row in records:
            if len(row) != width:
                raise TraceError(f"{path}:{lineno}: expected {width} fields ({','.join(self.header)}), got {len(row)}")
            step = _cell(row[cs], MAX_STEP)
            if step < 0:
                step = _int(path, lineno, "step", row[cs], MAX_STEP)
            inp = _cell(row[ci], MAX_LEN)
            if inp < 0:
                inp = _int(path, lineno, "input_len", row[ci], MAX_LEN)
            out = _cell(row[co], MAX_LEN)
            if out < 0:
                out = _int(path, lineno, "output_len", row[co], MAX_LEN)
            if cp >= 0:
                code = table.get(row[cp])
                codes.append(self._new_code(lineno, row[cp]) if code is None else code)
            if ct >= 0:
                self.turns.append(parse_turns(path, lineno, row[ct], out))
            steps.append(step)
            inputs.append(inp)
            outputs.append(out)
            if tick is not None and len(steps) % PROGRESS_ROWS == 0:
                tick()

    def _new_code(self, lineno: int, text: str) -> int:
        """The code of a prompt id cell not seen before: its id's, or a new one for a new id."""
        pid = _prompt_id(self.path, lineno, text)
        code = self.table.get(pid)
        if code is None:
            code = self.table[pid] = len(self.names)
            self.names.append(pid)
        self.table[text] = code
        return code

    def trace(self, name: str) -> Trace:
        """The rows read as a trace named `name`; a TraceError if there were none."""
        if not self.steps:
            raise TraceError(f"{self.path}:{self.header_line}: no rows after the header")
        notes = []
        extra = [c for c in self.header if c not in self.col]
        if extra:
            notes.append(f"ignored column(s): {', '.join(extra)}")
        return Trace.build(
            name=name,
            steps=np.frombuffer(self.steps, dtype=np.int64),
            prompt_ids=PromptIds(np.frombuffer(self.codes, dtype=np.int64), self.names) if self.cp >= 0 else None,
            input_len=np.frombuffer(self.inputs, dtype=np.int64),
            output_len=np.frombuffer(self.outputs, dtype=np.int64),
            notes=notes,
            turns=Turns.of(self.turns) if self.ct >= 0 else None,
        )


def parse_trace(stream: IO[bytes], path: Path | str, name: str | None = None, size: int = 0,
                progress: Progress | None = None) -> Trace:
    """Read CSV rows from a binary stream, one line at a time; `path` labels error messages, `size`
    (bytes, when known) is passed on to `progress`. Columns are kept in typed arrays, eight bytes a
    cell, and prompt ids as codes into a table of the distinct ids."""
    lines = (text for _, text in text_lines(stream, str(path), TraceError, MAX_LINE_BYTES))
    records = _records(lines, path)
    first = next(records, None)
    if first is None:
        raise TraceError(f"{path}:1: empty trace: expected a header {','.join(HEADER)} and one row per response")
    lineno, row = first
    columns = _Columns(path, *_header(path, lineno, row), header_line=lineno)
    columns.read(records, None if progress is None else lambda: progress(stream.tell(), size))
    return columns.trace(name or Path(path).stem)


def read_trace(path: Path, progress: Progress | None = None) -> Trace:
    """Read a trace CSV as a stream of lines: memory grows with its rows, never with its longest line."""
    try:
        with path.open("rb") as f:
            return parse_trace(f, path, size=os.fstat(f.fileno()).st_size, progress=progress)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: a folder, not a trace file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None


def output_file(path: Path) -> Path:
    """`path` itself when a trace can be written there: a file name, not a folder."""
    if not path.name or path.is_dir():
        raise TraceError(f"cannot write {path}: it is a folder; give a file name")
    return path


def write_trace(path: Path, rows: Iterable[tuple[int, str | None, int, int]], turns: Sequence[str] | None = None) -> int:
    """Write (step, prompt_id, input_len, output_len) rows atomically; returns the row count.

    prompt_id None on every row writes a file without the prompt_id column; `turns` (a `turns_text`
    cell per row) adds the turns column. A path that cannot be written is a PathError naming it.
    """
    rows = list(rows)
    if turns is not None and len(turns) != len(rows):
        raise ValueError("turns: one cell per row")
    with_ids = any(r[1] is not None for r in rows)
    if with_ids and any(r[1] is None for r in rows):
        raise ValueError("prompt_id: either every row has one or none does")
    with user_paths("write", path):
        tmp = output_file(path).with_name(path.name + ".tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with tmp.open("w", newline="", encoding="utf-8") as f:
                w = csv.writer(f, lineterminator="\n")
                header = HEADER if with_ids else ("step", "input_len", "output_len")
                w.writerow((*header, "turns") if turns is not None else header)
                for k, (step, pid, inp, out) in enumerate(rows):
                    cells = (step, pid, inp, out) if with_ids else (step, inp, out)
                    w.writerow((*cells, turns[k]) if turns is not None else cells)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
    return len(rows)
