"""What every bench writes beside its printed tables (tables.py): the machine it ran on, and its
results, each file written whole (a crash or Ctrl-C never leaves half a results.json)."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from rhymerl.errors import user_paths
from rhymerl.workers import atomic


def machine() -> dict[str, Any]:
    """The CPU, its logical cores, the OS and the Python and numpy versions."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def write_json(path: Path, data: Any, indent: int = 2) -> None:
    """`data` as indented JSON (results.json and the like), atomically."""
    atomic.write_text(path, json.dumps(data, indent=indent) + "\n")


def write_text(path: Path, text: str) -> None:
    """A bench's text output (table.md, a note), atomically."""
    atomic.write_text(path, text)


def write_results(out: Path, result: Any, table_md: str, plot: Callable[[Path], None], png: str,
                  console: Console) -> None:
    """A bench's committed outputs in `out`: results.json, table.md and the plot `png`; says where."""
    with user_paths("write the bench results into", out):
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "results.json", result, indent=1)
        write_text(out / "table.md", table_md)
        plot(out / png)
    console.print(f"results in {out}", markup=False, highlight=False)
