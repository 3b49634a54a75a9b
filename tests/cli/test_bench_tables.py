"""Bench tables on an 80-column terminal: split over the same rows, never cut."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from rhymerl.tools.bench.tables import fit

HEADERS = ("policy", "rollout s/step", "bubble %", "samples/s", "vs equal", "migrated %", "over bound %",
           "steady s/step", "steady over bound %", "mean batch", "ranked by")
ROWS = [
    ("equal", "274.6", "14.9", "3.73", "1.00x", "0.00", "66.7", "274.7", "67.0", "92.3", "random"),
    ("histopipe (2-tier, no migration)", "267.8", "11.8", "3.82", "1.03x", "0.00", "62.5", "14.1", "-91.4", "96.3",
     "history"),
]


def render(table: Table, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    for part in fit(table, console):
        console.print(part)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def wide_table() -> Table:
    t = Table(title="rollout scheduling", caption="lower bound over the run")
    for h in HEADERS:
        t.add_column(h, justify="left" if h == "policy" else "right")
    for row in ROWS:
        t.add_row(*row)
    return t


def test_a_wide_table_is_split_into_parts_that_fit_80_columns_with_every_cell_whole() -> None:
    text = render(wide_table(), 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    for cell in {c for row in ROWS for c in row[1:]}:
        assert cell in text
    # the key column opens every part
    assert text.count("│ equal ") >= 2
    assert text.count("rollout scheduling") == 1 and text.count("lower bound over the run") == 1


def test_a_table_that_fits_is_printed_unchanged() -> None:
    t = wide_table()
    assert fit(t, Console(file=io.StringIO(), width=200)) == [t]
    assert len(fit(t, Console(file=io.StringIO(), width=80))) >= 2
