"""Host time of the torch engine's n-gram source per pass (propose, then settle one token per sequence)
before and after it read the whole context (commit 4b6924e), side by side in one process.

Before: a 2,048-token buffer per slot, full at 2,048 (a longer sequence matched a frozen context),
and the batch's rows copied every pass. After: the buffer doubles as a sequence outgrows it and a
pass over slots 0..n-1 reads it in place. The old class is taken from git (62c26ab), so the
comparison needs the repository's history.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/ngram-context/measure.py > benchmarks/ngram-context/results.md
"""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.rollout.generation import GenRequest
from rhymerl.workers.rollout.speculators import NgramDrafts

BEFORE = "62c26ab"
SIZES = [(64, 4096), (256, 8192), (1024, 2048), (1024, 16384)]
REPEATS = 15


def _before() -> ModuleType:
    """speculators.py as it was at BEFORE, loaded as a module of its own."""
    repo = Path(__file__).resolve().parents[2]
    text = subprocess.run(["git", "show", f"{BEFORE}:workers/rollout/speculators.py"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "speculators_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("speculators_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _grown(cls: Any, batch: int, length: int) -> tuple[Any, list[int]]:
    """A source whose `batch` sequences hold `length` random tokens (a 256-token prompt, then chunks)."""
    drafts = cls(SpeculationSpec(), None)
    rng = np.random.default_rng(0)
    slots = list(range(batch))
    for s in slots:
        drafts.begin(s, GenRequest(rng.integers(3, 200, 256).tolist(), s))
    for _ in range(256, length, 512):
        drafts.settle(slots, [0] * batch, [0] * batch, rng.integers(3, 200, (batch, 512)).tolist())
    return drafts, slots


def main() -> None:
    sources = {"before": _before().NgramDrafts, "after": NgramDrafts}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; command: {' '.join(['python', *sys.argv])}\n")
    print("| batch | tokens per sequence | before ms/pass | after ms/pass | before / after |")
    print("|---|---|---|---|---|")
    for batch, length in SIZES:
        built = {name: _grown(cls, batch, length) for name, cls in sources.items()}
        times: dict[str, list[float]] = {name: [] for name in built}
        for _ in range(REPEATS):  # interleaved
            for name, (drafts, slots) in built.items():
                start = time.perf_counter()
                drafts.propose(slots, batch)
                drafts.settle(slots, [0] * batch, [0] * batch, [[7]] * batch)
                times[name].append(time.perf_counter() - start)
        before, after = (float(np.median(times[n])) for n in ("before", "after"))
        print(f"| {batch} | {length} | {before * 1e3:.2f} | {after * 1e3:.2f} | {before / after:.2f} |")


if __name__ == "__main__":
    main()
