"""Progress on stderr while a trace file is read: millions of rows take seconds, which should not pass
in silence. A terminal gets a bar that leaves no line behind; a pipe or a log gets a plain line every
few seconds, and nothing at all for a file read faster than that."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from .io import Progress as OnProgress

LINE_EVERY_S = 5.0


@contextmanager
def reading_bar(label: str, enabled: bool = True) -> Iterator[OnProgress | None]:
    """A callback for read_trace's `progress` (None when not `enabled`)."""
    console = Console(stderr=True)
    if not enabled:
        yield None
    elif console.is_terminal:
        columns = (TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(f"reading {label}", total=None)
            yield lambda done, size: bar.update(task, completed=done, total=size or None)
    else:
        start = last = time.monotonic()

        def line(done: int, size: int) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= LINE_EVERY_S:
                last = now
                share = f" ({100 * done / size:.0f}%)" if size else ""
                console.print(f"reading {label}: {done >> 20} MiB{share} in {now - start:.0f} s", markup=False,
                              highlight=False, soft_wrap=True)

        yield line
