"""Progress on stderr for long jobs over a trace (reading a file of millions of rows, simulating them
under every policy), which should not pass in silence. A terminal gets a bar that leaves no line
behind; a pipe or a log gets a plain line every few seconds, and nothing at all for a job done faster
than that."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from .io import Progress as OnProgress

LINE_EVERY_S = 5.0

Line = Callable[[str, int, int, float], str]
"""The plain line for (label, done, total, seconds since the start)."""


class Ticker:
    """Where a job stands: call it with (done, total); `describe` names what it is doing now."""

    def __init__(self, console: Console, bar: Progress | None, line: Line, label: str) -> None:
        self.console = console
        self.bar = bar
        self.line = line
        self.label = label
        self.start = self.last = time.monotonic()
        self._task = bar.add_task(label, total=None) if bar is not None else None

    def describe(self, label: str) -> None:
        self.label = label
        if self.bar is not None and self._task is not None:
            self.bar.update(self._task, description=label)

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None and self._task is not None:
            self.bar.update(self._task, completed=done, total=total or None)
            return
        now = time.monotonic()
        if now - self.last >= LINE_EVERY_S:
            self.last = now
            self.console.print(self.line(self.label, done, total, now - self.start), markup=False,
                               highlight=False, soft_wrap=True)


@contextmanager
def ticker(label: str, columns: Sequence[ProgressColumn], line: Line, enabled: bool = True) -> Iterator[Ticker | None]:
    """A `Ticker` on stderr (None when not `enabled`): the bar shows `columns` after the label's."""
    console = Console(stderr=True)
    if not enabled:
        yield None
    elif console.is_terminal:
        with Progress(TextColumn("{task.description}", markup=False), BarColumn(), *columns, TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            yield Ticker(console, bar, line, label)
    else:
        yield Ticker(console, None, line, label)


def _bytes_line(label: str, done: int, size: int, seconds: float) -> str:
    share = f" ({100 * done / size:.0f}%)" if size else ""
    return f"{label}: {done >> 20} MiB{share} in {seconds:.0f} s"


@contextmanager
def reading_bar(label: str, enabled: bool = True) -> Iterator[OnProgress | None]:
    """A callback for read_trace's `progress` (None when not `enabled`)."""
    with ticker(f"reading {label}", (DownloadColumn(),), _bytes_line, enabled) as tick:
        yield tick


class _RowsPerSecond(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"{task.speed:,.0f} rows/s" if task.speed else "")


def rows_line(label: str, done: int, total: int, seconds: float) -> str:
    share = f" ({100 * done / total:.0f}%)" if total else ""
    rate = f", {done / seconds:,.0f} rows/s" if seconds > 0 else ""
    return f"{label}: {done:,} of {total:,} rows{share} in {seconds:.0f} s{rate}"


@contextmanager
def rows_bar(label: str, enabled: bool = True) -> Iterator[Ticker | None]:
    """A `Ticker` counting trace rows done, with their rate (None when not `enabled`)."""
    with ticker(label, (MofNCompleteColumn(), _RowsPerSecond()), rows_line, enabled) as tick:
        yield tick
