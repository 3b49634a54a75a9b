"""The line between a user's mistake and our bug.

Anything a user can fix (a spec, a YAML file, a data set, a dump, a trace, a run folder, a reward
function of theirs, the disk they pointed us at) raises a `UserError`: the CLI prints its message
as one plain line, never interpreted as markup, and exits 2. Every other exception is a bug in
rhymerl and stays a traceback. Messages name the file and line or the field they are about.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class UserError(Exception):
    """Input or environment the user can fix; `str(exc)` is the whole message shown to them."""


class OptionError(UserError):
    """A command-line option value that cannot be used; the message names the option."""


class PathError(UserError):
    """A file or folder the user named that cannot be read or written; the message names it."""


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
