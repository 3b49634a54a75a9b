"""Whole-or-nothing file writes: a crash (SIGKILL, power loss, a full disk) leaves the old file or
the new one, never a torn mix.

The new content goes to a temporary name in the same folder, is flushed to the disk, then renamed
over the target (rename is atomic within a filesystem), and the folder entry itself is flushed so
the rename survives a power loss too. A failed write removes its temporary file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def fsync_path(folder: Path) -> None:
    """Flush a file's content, or a folder's entries (a rename or a new file in it), to the disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_name(path: Path) -> Path:
    """Where `path`'s next version is written before it is renamed into place."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextlib.contextmanager
def open_atomic(path: Path, mode: str = "w") -> Iterator[IO[str]]:
    """Write `path` through a temporary file that replaces it only if the block finishes."""
    tmp = temporary_name(path)
    try:
        with tmp.open(mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def write_text(path: Path, text: str) -> None:
    with open_atomic(path) as f:
        f.write(text)


def is_temporary(path: Path) -> bool:
    """A leftover of an interrupted atomic write (safe to delete when nobody writes)."""
    return path.name.startswith(".") and path.name.endswith(".tmp")
