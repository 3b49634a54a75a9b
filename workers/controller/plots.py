"""Plots of a run's metrics (PNG): what people would rather see than read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PANELS = [
    ("reward_mean", "mean reward"),
    ("response_length_mean", "mean response length (tokens)"),
    ("rollout_tokens_per_s", "rollout tokens/s"),
    ("entropy", "entropy (nats/token)"),
]


def plot_metrics(rows: list[dict[str, Any]], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    steps = [r["step"] for r in rows]
    for ax, (key, label) in zip(axes.flat, PANELS, strict=False):
        ax.plot(steps, [r.get(key, float("nan")) for r in rows], marker=".")
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    ax = axes.flat[len(PANELS)]
    bottom = [0.0] * len(rows)
    for key in ("time_rollout_s", "time_reward_s", "time_train_s"):
        vals = [r.get(key, 0.0) for r in rows]
        ax.bar(steps, vals, bottom=bottom, label=key.removeprefix("time_").removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_title("step time (s)")
    ax.set_xlabel("step")
    ax.legend()
    ax = axes.flat[len(PANELS) + 1]
    by_epoch: dict[int, list[float]] = {}
    for r in rows:
        by_epoch.setdefault(r["epoch"], []).append(r["reward_mean"])
    epochs = sorted(by_epoch)
    ax.bar([str(e) for e in epochs], [sum(v) / len(v) for v in (by_epoch[e] for e in epochs)])
    ax.set_title("mean reward per epoch")
    ax.set_xlabel("epoch")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
