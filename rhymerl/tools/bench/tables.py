"""Bench tables that stay readable on a narrow terminal.

Rich squeezes a table wider than the console by wrapping and cutting cells ("274…"), which left
the benches unreadable at 80 columns. A table that does not fit is printed instead as several
tables over the same rows, each repeating the first (key) column, with every cell whole.
"""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

PAD = 3  # a cell's padding on both sides plus its separator


def _widths(table: Table, console: Console, width: int, keys: int) -> list[int]:
    """Per column: its widest cell (cells never wrap) or its header's longest word, whichever is wider.
    A key column may wrap once it would take more than a third of the width."""
    options = console.options.update_width(width)
    widths = []
    for i, column in enumerate(table.columns):
        cells = [Measurement.get(console, options, cell) for cell in column.cells]
        head = Measurement.get(console, options, column.header).minimum if table.show_header else 0
        widest = max((m.maximum for m in cells), default=0)
        if i < keys and widest > width // 3:
            widest = max(width // 3, max((m.minimum for m in cells), default=0))
        widths.append(max(head, widest, 1))
    return widths


def _natural(table: Table, console: Console) -> int:
    """Width of `table` with no cell and no header wrapped."""
    options = console.options.update_width(1 << 16)
    total = 1
    for column in table.columns:
        parts = [*column.cells, column.header] if table.show_header else list(column.cells)
        total += max((Measurement.get(console, options, p).maximum for p in parts), default=0) + PAD
    return total


def _header_widths(table: Table, console: Console) -> list[int]:
    options = console.options.update_width(1 << 16)
    return [Measurement.get(console, options, column.header).maximum if table.show_header else 0
            for column in table.columns]


def fit(table: Table, console: Console, width: int | None = None, keys: int = 1) -> list[Table]:
    """`table` itself when it fits `width` (default: the console's); else the same table with headers
    wrapped, or parts of it over the same rows, each opening with the first `keys` columns, so that
    no cell is wrapped or cut."""
    width = width or console.width
    if len(table.columns) <= keys + 1 or _natural(table, console) <= width:
        return [table]
    widths = _widths(table, console, width, keys)
    room = width - 1 - sum(widths[i] + PAD for i in range(keys))
    parts: list[list[int]] = [[]]
    used = 0
    for i in range(keys, len(table.columns)):
        need = widths[i] + PAD
        if parts[-1] and used + need > room:
            parts.append([])
            used = 0
        parts[-1].append(i)
        used += need
    cells = [list(column.cells) for column in table.columns]
    heads = _header_widths(table, console)
    out = []
    for n, picked in enumerate(parts):
        spare = room - sum(widths[i] + PAD for i in picked)
        for i in sorted(picked, key=lambda i: heads[i] - widths[i]):  # unwrap the shortest headers first
            grow = min(spare, max(0, heads[i] - widths[i]))
            widths[i] += grow
            spare -= grow
        part = Table(title=table.title if n == 0 else None, caption=table.caption if n == len(parts) - 1 else None,
                     box=table.box, show_header=table.show_header, header_style=table.header_style,
                     show_lines=table.show_lines, title_justify=table.title_justify,
                     caption_justify=table.caption_justify)
        for i in (*range(keys), *picked):
            column = table.columns[i]
            part.add_column(column.header, justify=column.justify, style=column.style, width=widths[i],
                            overflow="fold")
        for r, row in enumerate(table.rows):
            part.add_row(*(cells[i][r] for i in (*range(keys), *picked)), style=row.style,
                         end_section=row.end_section)
        out.append(part)
    return out


def print_table(console: Console, table: Table, keys: int = 1) -> None:
    """Print `table`, split into parts over the same rows when the console is too narrow for it."""
    for part in fit(table, console, keys=keys):
        console.print(part)
