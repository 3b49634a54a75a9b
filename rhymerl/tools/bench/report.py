"""What every bench writes beside its printed tables (tables.py): the machine it ran on, and its
results, each file written whole (a crash or Ctrl-C never leaves half a results.json)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

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
