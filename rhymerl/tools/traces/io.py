"""Read and write workload trace CSVs (docs/formats.md, "Workload trace CSV").

Files come from other systems, so reading is strict and every complaint names the file, the line
and the column. Writing is atomic: a failed export leaves no half-written file behind.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from pathlib import Path

from rhymerl.errors import UserError, user_paths

from .model import Trace

REQUIRED = ("step", "input_len", "output_len")
OPTIONAL = ("prompt_id",)
HEADER = ("step", "prompt_id", "input_len", "output_len")


class TraceError(UserError):
    """A trace that cannot be read; the message names the file and line."""


def _int(path: Path, lineno: int, column: str, text: str) -> int:
    text = text.strip()
    if not text:
        raise TraceError(f"{path}:{lineno}: {column}: empty, expected a non-negative integer")
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{path}:{lineno}: {column}: {text!r} is not an integer") from None
    if value < 0:
        raise TraceError(f"{path}:{lineno}: {column}: {value} is negative")
    return value


def parse_trace(text: str, path: Path, name: str | None = None) -> Trace:
    """Parse CSV text; `path` only labels error messages."""
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    header: list[str] | None = None
    header_line = 0
    steps: list[int] = []
    pids: list[str] = []
    inputs: list[int] = []
    outputs: list[int] = []
    col: dict[str, int] = {}
    for row in reader:
        lineno = reader.line_num
        if not row or all(not cell.strip() for cell in row) or row[0].lstrip().startswith("#"):
            continue
        if header is None:
            header = [c.strip().lower() for c in row]
            header_line = lineno
            dupes = sorted({c for c in header if header.count(c) > 1})
            if dupes:
                raise TraceError(f"{path}:{lineno}: header: duplicate column(s) {', '.join(dupes)}")
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise TraceError(
                    f"{path}:{lineno}: header: missing column(s) {', '.join(missing)}; "
                    f"expected {','.join(HEADER)} (prompt_id optional), got {','.join(header)}"
                )
            col = {c: header.index(c) for c in (*REQUIRED, *OPTIONAL) if c in header}
            continue
        if len(row) != len(header):
            raise TraceError(f"{path}:{lineno}: expected {len(header)} fields ({','.join(header)}), got {len(row)}")
        steps.append(_int(path, lineno, "step", row[col["step"]]))
        inputs.append(_int(path, lineno, "input_len", row[col["input_len"]]))
        outputs.append(_int(path, lineno, "output_len", row[col["output_len"]]))
        if "prompt_id" in col:
            pid = row[col["prompt_id"]].strip()
            if not pid:
                raise TraceError(
                    f"{path}:{lineno}: prompt_id: empty; leave the column out when responses have no prompt id"
                )
            pids.append(pid)
    if header is None:
        raise TraceError(f"{path}:1: empty trace: expected a header {','.join(HEADER)} and one row per response")
    if not steps:
        raise TraceError(f"{path}:{header_line}: no rows after the header")
    notes = []
    extra = [c for c in header if c not in col]
    if extra:
        notes.append(f"ignored column(s): {', '.join(extra)}")
    return Trace.build(
        name=name or path.stem,
        steps=steps,
        prompt_ids=pids if "prompt_id" in col else None,
        input_len=inputs,
        output_len=outputs,
        notes=notes,
    )


def read_trace(path: Path) -> Trace:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_trace(text, path)


def write_trace(path: Path, rows: Iterable[tuple[int, str | None, int, int]]) -> int:
    """Write (step, prompt_id, input_len, output_len) rows atomically; returns the row count.

    prompt_id None on every row writes a file without the prompt_id column. A path that cannot be
    written is a PathError naming it.
    """
    rows = list(rows)
    with_ids = any(r[1] is not None for r in rows)
    if with_ids and any(r[1] is None for r in rows):
        raise ValueError("prompt_id: either every row has one or none does")
    tmp = path.with_name(path.name + ".tmp")
    with user_paths("write", path):
        if path.is_dir():
            raise TraceError(f"cannot write {path}: it is a folder; give a file name")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with tmp.open("w", newline="", encoding="utf-8") as f:
                w = csv.writer(f, lineterminator="\n")
                w.writerow(HEADER if with_ids else ("step", "input_len", "output_len"))
                for step, pid, inp, out in rows:
                    w.writerow((step, pid, inp, out) if with_ids else (step, inp, out))
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
    return len(rows)
