"""The line between a user's mistake and our bug.

Anything a user can fix (a spec, a YAML file, a data set, a dump, a trace, a run folder, a reward
function of theirs, the disk they pointed us at) raises a `UserError`: the CLI prints its message
as one plain line, never interpreted as markup, and exits with the class's `exit_code` (2). A run
that the machinery under it failed (a lost worker or node, Ray's own errors) raises `RunFailed`, a
UserError with exit code 1: one line too, saying how to resume. Every other exception is a bug in rhymerl and stays a traceback.
Messages name the file and line or the field they are about.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import ClassVar

_TERMINAL_CODES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def plain(text: str) -> str:
    """`text` without terminal control sequences (colours, cursor moves: Ray colours its workers'
    errors), for what is written to a file or compared as text."""
    return _TERMINAL_CODES.sub("", text)


class UserError(Exception):
    """Input or environment the user can fix; `str(exc)` is the whole message shown to them."""

    exit_code: ClassVar[int] = 2


class RunFailed(UserError):
    """The machinery under a run failed, not the user's input nor our code: a worker or a Ray node
    lost for good, restarts used up. Exit 1, and the run resumes from its last checkpoint."""

    exit_code: ClassVar[int] = 1


class OptionError(UserError):
    """A command-line option value that cannot be used; the message names the option."""


class PathError(UserError):
    """A file or folder the user named that cannot be read or written; the message names it."""


class DiskFull(PathError):
    """No space left where the run writes. Every file is written whole or not at all, so what was
    written before is intact and the run resumes once there is room."""


class NonFiniteError(UserError):
    """A nan or inf was about to reach the weights under the `fail` policy (`algorithm.on_nonfinite`:
    a reward, an advantage, a loss or a gradient; workers/train/guards.py checks the tensors)."""


FULL = (errno.ENOSPC, errno.EDQUOT)
_FULL_WORDS = ("no space left on device", "disk quota exceeded", "os error 28)", "os error 122)")


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or an error it came from, says the disk is full: an OSError with ENOSPC or
    EDQUOT, or a library's error that quotes one (safetensors wraps Rust's I/O error as text)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL:
            return True
        if any(w in str(e).lower() for w in _FULL_WORDS):
            return True
        cause = getattr(e, "cause", None)  # Ray's wrapper of a worker's error
        todo += [e.__cause__, e.__context__, cause if isinstance(cause, BaseException) else None]
    return False


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def disk_full(where: Path | str, doing: str = "", need_bytes: int | None = None) -> DiskFull:
    """The one line for a full disk under `where`: what was being written, the space free there
    and the space the write needed, where known."""
    free: int | None = None
    probe = Path(where)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    with suppress(OSError):
        free = shutil.disk_usage(probe).free
    space = [f"{_size(free)} free"] if free is not None else []
    if need_bytes is not None:
        space.append(f"it needs about {_size(need_bytes)}")
    what = f" while writing {doing}" if doing else ""
    detail = f" ({', '.join(space)})" if space else ""
    return DiskFull(f"no space left on the disk of {where}{what}{detail}; what was written before is intact")


@contextmanager
def user_paths(doing: str, path: Path | str | None = None) -> Iterator[None]:
    """The I/O boundary of paths a user gave: an OSError inside becomes a PathError naming `path`,
    what was being done and the file the OS complained about, e.g. `cannot write out/t.csv: ...`."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.filename is not None and str(exc.filename) != str(path):
            reason = f"{exc.filename}: {reason}"
        target = f" {path}" if path is not None else ""
        raise PathError(f"cannot {doing}{target}: {reason}") from None


def writable_folder(path: Path) -> Path:
    """`path` itself, once it is clear that outputs can be written there: an existing folder we may
    write into, or a folder we may create (its nearest existing ancestor is a writable folder).
    Checked before a long computation; nothing is created here."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        where = "it is a file" if probe == path else f"{probe} is a file"
        raise PathError(f"cannot write into {path}: {where}, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PathError(f"cannot write into {path}: {probe} is not writable")
    return path
