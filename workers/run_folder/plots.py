"""Plots of a run's metrics (PNG): what people would rather see than read.

A step's reward and length are means over a few prompts, so step to step they are mostly which
prompts the step drew: each such panel shows the steps faintly and their mean over an epoch's
worth of steps (every prompt once) boldly. Speculation (tokens per pass, acceptance) has a panel
of its own and a per-epoch one: the point of history drafts is that later epochs pass faster.

Built on a bare `matplotlib.figure.Figure` (no pyplot state, no backend switch at import): the
run's plot is drawn the same way whatever backend the process has chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from rhymerl.workers.run_folder.step_metrics import StepMetrics

SMOOTHED = [
    ("reward_mean", "mean reward"),
    ("response_length_mean", "mean response length (tokens)"),
]
PLAIN = [
    ("rollout_tokens_per_s", "rollout tokens/s"),
    ("entropy", "entropy (nats/token)"),
]


def _value(m: StepMetrics, key: str) -> float:
    value = getattr(m, key)
    return float("nan") if value is None else float(value)


def epoch_window(rows: Sequence[StepMetrics]) -> int:
    """Steps in the run's first epoch (each prompt drawn once): the span the noisy panels average over."""
    return max(1, sum(1 for m in rows if m.epoch == rows[0].epoch)) if rows else 1


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and up to `window - 1` before it (NaNs left out; NaN where all are)."""
    out = []
    for i in range(len(values)):
        seen = [v for v in values[max(0, i - window + 1): i + 1] if v == v]
        out.append(sum(seen) / len(seen) if seen else float("nan"))
    return out


def _labelled(ax: Axes, title: str, x: str = "step") -> None:
    ax.set_title(title)
    ax.set_xlabel(x)
    ax.grid(alpha=0.3)


def _smoothed(ax: Axes, rows: Sequence[StepMetrics], key: str, label: str) -> None:
    steps, values, window = [m.step for m in rows], [_value(m, key) for m in rows], epoch_window(rows)
    ax.plot(steps, values, marker=".", alpha=0.3, label="step")
    ax.plot(steps, trailing_mean(values, window), linewidth=2, label=f"mean of {window} steps")
    ax.legend(fontsize="small")
    _labelled(ax, label)


def _speculation(ax: Axes, rows: Sequence[StepMetrics]) -> None:
    steps = [m.step for m in rows]
    ax.plot(steps, [m.tokens_per_pass for m in rows], marker=".", color="C0")
    ax.set_ylabel("tokens per pass", color="C0")
    twin = ax.twinx()
    twin.plot(steps, [_value(m, "spec_acceptance") for m in rows], marker=".", color="C1")
    twin.set_ylabel("draft acceptance", color="C1")
    twin.set_ylim(0, 1.05)
    _labelled(ax, "speculation")


def _step_time(ax: Axes, rows: Sequence[StepMetrics]) -> None:
    steps = [m.step for m in rows]
    bottom = [0.0] * len(rows)
    for key, label in (("time_rollout_s", "rollout"), ("time_reward_s", "scoring"), ("time_train_s", "train")):
        vals = [_value(m, key) for m in rows]
        ax.bar(steps, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.legend(fontsize="small")
    _labelled(ax, "step time (s)")


def _by_epoch(ax: Axes, title: str, weighted: dict[int, list[tuple[float, float]]]) -> None:
    """Per epoch, the weighted mean of (value, weight) pairs: rewards by samples, tokens per pass by passes."""
    epochs = sorted(weighted)
    ax.bar([str(e) for e in epochs],
           [sum(v * w for v, w in weighted[e]) / max(sum(w for _, w in weighted[e]), 1e-12) for e in epochs])
    _labelled(ax, title, "epoch")


def plot_metrics(rows: Sequence[StepMetrics], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(18, 7))
    axes = list(fig.subplots(2, 4).flat)
    for ax, (key, label) in zip(axes, SMOOTHED, strict=False):
        _smoothed(ax, rows, key, label)
    _speculation(axes[2], rows)
    for ax, (key, label) in zip(axes[3:], PLAIN, strict=False):
        ax.plot([m.step for m in rows], [_value(m, key) for m in rows], marker=".")
        _labelled(ax, label)
    _step_time(axes[5], rows)
    rewards: dict[int, list[tuple[float, float]]] = {}
    passes: dict[int, list[tuple[float, float]]] = {}
    for m in rows:
        rewards.setdefault(m.epoch, []).append((m.reward_mean, float(m.samples)))
        passes.setdefault(m.epoch, []).append((m.tokens_per_pass, m.rollout_tokens / max(m.tokens_per_pass, 1e-12)))
    _by_epoch(axes[6], "mean reward per epoch", rewards)
    _by_epoch(axes[7], "tokens per pass per epoch", passes)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out
