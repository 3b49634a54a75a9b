"""Plots of a run's metrics (PNG): what people would rather see than read.

Built on a bare `matplotlib.figure.Figure` (no pyplot state, no backend switch at import): the
run's plot is drawn the same way whatever backend the process has chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from rhymerl.workers.run_folder.step_metrics import StepMetrics

PANELS = [
    ("reward_mean", "mean reward"),
    ("response_length_mean", "mean response length (tokens)"),
    ("rollout_tokens_per_s", "rollout tokens/s"),
    ("entropy", "entropy (nats/token)"),
]


def _value(m: StepMetrics, key: str) -> float:
    value = getattr(m, key)
    return float("nan") if value is None else float(value)


def plot_metrics(rows: Sequence[StepMetrics], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(14, 7))
    axes = fig.subplots(2, 3)
    steps = [m.step for m in rows]
    for ax, (key, label) in zip(axes.flat, PANELS, strict=False):
        ax.plot(steps, [_value(m, key) for m in rows], marker=".")
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    ax = axes.flat[len(PANELS)]
    bottom = [0.0] * len(rows)
    for key in ("time_rollout_s", "time_reward_s", "time_train_s"):
        vals = [_value(m, key) for m in rows]
        ax.bar(steps, vals, bottom=bottom, label=key.removeprefix("time_").removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_title("step time (s)")
    ax.set_xlabel("step")
    ax.legend()
    ax = axes.flat[len(PANELS) + 1]
    by_epoch: dict[int, list[float]] = {}
    for m in rows:
        by_epoch.setdefault(m.epoch, []).append(m.reward_mean)
    epochs = sorted(by_epoch)
    ax.bar([str(e) for e in epochs], [sum(v) / len(v) for v in (by_epoch[e] for e in epochs)])
    ax.set_title("mean reward per epoch")
    ax.set_xlabel("epoch")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out
