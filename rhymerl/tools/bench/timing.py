"""Side-by-side timing for the micro-benchmarks under benchmarks/: the machines here are shared and
noisy, so variants are called in turn and compared by their medians, never timed one after another."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each function, the functions called in turn `repeats` times."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}
