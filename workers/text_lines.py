"""The lines of a text file a user hands us (JSONL prompts, rollout dumps, trace CSVs), read as bytes.

Such a file may hold anything: bytes that are not UTF-8, NUL bytes, one line of a gigabyte, JSON
nested a hundred thousand deep. Each is a one-line error naming `file:line`, raised as the caller's
UserError subclass, and reading is one bounded line at a time, so memory does not grow with the
worst line or with the file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

from rhymerl.errors import UserError


def text_lines(stream: IO[bytes], source: str, error: type[UserError], max_bytes: int) -> Iterator[tuple[int, str]]:
    """(line number, text with its line ending) of every line; a leading byte-order mark is dropped.

    A line longer than `max_bytes`, a byte that is not UTF-8 and a NUL byte are `error`s naming
    `source:line` and the column."""
    lineno = 0
    while True:
        raw = stream.readline(max_bytes + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > max_bytes:
            raise error(f"{source}:{lineno}: line longer than {max_bytes} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{source}:{lineno}: not UTF-8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}") from None
        nul = text.find("\0")
        if nul >= 0:
            raise error(f"{source}:{lineno}: NUL byte at column {len(text[:nul].encode()) + 1}")
        if lineno == 1:
            text = text.removeprefix("\ufeff")
        yield lineno, text


def json_line(text: str, where: str, error: type[UserError], parse_int: Callable[[str], Any] | None = None) -> Any:
    """One JSON value; invalid JSON, a number Python refuses (over 4300 digits) and nesting deeper than
    the interpreter's recursion limit are `error`s prefixed with `where` (`file:line`). `parse_int`
    as json.loads takes it."""
    try:
        return json.loads(text, parse_int=parse_int)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not JSON: {exc.msg} at column {exc.colno}") from None
    except ValueError:
        raise error(f"{where}: a number too long to read (over {sys.get_int_max_str_digits()} digits)") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply") from None
