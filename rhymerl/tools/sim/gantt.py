"""Gantt charts of simulated rollouts: one row per worker, one colour per step, gaps are bubbles."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .metrics import SimResult


def plot_gantt(result: SimResult, path: Path, title: str | None = None) -> Path:
    """Write a PNG: busy intervals per worker coloured by step, migrations as markers.

    A worker running several steps at once (the async pipeline) is coloured by the step it
    admitted samples of last.
    """
    cmap = matplotlib.colormaps["tab20"]
    n = result.workers
    fig = Figure(figsize=(12, max(3.0, 0.28 * n + 1.6)), dpi=110)
    ax = fig.subplots()
    by_worker: dict[int, list[tuple[float, float]]] = {}
    colors: dict[int, list[tuple[float, float, float, float]]] = {}
    for w, start, end, step in result.segments:
        by_worker.setdefault(w, []).append((start, end - start))
        colors.setdefault(w, []).append(cmap(step % 20))
    for w, spans in by_worker.items():
        ax.broken_barh(spans, (w - 0.4, 0.8), facecolors=colors[w], linewidth=0)
    intra = [(t, dst) for t, _, _, dst in result.migrations if dst >= 0]
    inter = [(t, src) for t, _, src, dst in result.migrations if dst < 0]
    if intra:
        ax.scatter([t for t, _ in intra], [w for _, w in intra], marker=">", s=14, c="black", label="intra-step in")
    if inter:
        ax.scatter([t for t, _ in inter], [w for _, w in inter], marker="x", s=14, c="red", label="to next step")
    steps = sorted({s for *_, s in result.segments})
    handles: list[Patch] = [Patch(color=cmap(s % 20), label=f"step {s}") for s in steps[:20]]
    ax.set_xlabel("simulated seconds")
    ax.set_ylabel("rollout worker")
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlim(0, result.makespan * 1.01 if result.makespan > 0 else 1)
    ax.invert_yaxis()
    ax.set_title(
        title
        or f"{result.policy}: {result.samples_per_s:.2f} samples/s, bubbles {100 * result.bubble_ratio:.1f}%, "
        f"{100 * result.migrated_fraction:.2f}% migrated"
    )
    extra = ax.get_legend_handles_labels()[0]
    ax.legend(handles=[*handles, *extra], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def plot_all(results: Sequence[SimResult], folder: Path, slug: dict[str, str]) -> list[Path]:
    return [plot_gantt(r, folder / f"gantt_{slug[r.policy]}.png") for r in results]
