"""Tabulate ab.sh's runs in OUT: per label, the epoch's tokens per pass (all its tokens over all its
passes) and rollout seconds (the sum over its steps), medians over the repeats; whether every run
generated the same responses; and a plot per step (OUT/ab.png).

python benchmarks/group-drafts/ab_summary.py OUT LABEL_A LABEL_B ["TITLE"]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from matplotlib.figure import Figure


def runs(out: Path, label: str) -> list[list[dict[str, float]]]:
    return [[json.loads(line) for line in p.read_text().splitlines()]
            for p in sorted(out.glob(f"{label}-*.metrics.jsonl"))]


def tokens_per_pass(run: list[dict[str, float]]) -> float:
    tokens = sum(r["rollout_tokens"] for r in run)
    return tokens / sum(r["rollout_tokens"] / r["tokens_per_pass"] for r in run)


def main(out: Path, labels: list[str], title: str) -> None:
    table = {label: runs(out, label) for label in labels}
    digests = {p.name: p.read_text().strip() for p in sorted(out.glob("*.responses.sha256"))}
    print(f"{len(digests)} runs, responses identical across all of them: {len(set(digests.values())) == 1}")
    print("| setting | runs | tokens per pass (median) | rollout s (median of sums) | each run's rollout s |")
    print("|---|---|---|---|---|")
    medians = {}
    for label, rs in table.items():
        tpp = statistics.median(tokens_per_pass(run) for run in rs)
        sums = [sum(r["time_rollout_s"] for r in run) for run in rs]
        medians[label] = statistics.median(sums)
        print(f"| {label} | {len(rs)} | {tpp:.3f} | {medians[label]:.2f} | {', '.join(f'{s:.2f}' for s in sums)} |")
    a, b = labels
    print(f"rollout time, {a} / {b}: {medians[a] / medians[b]:.3f}")
    fig = Figure(figsize=(9, 4))
    ax1, ax2 = fig.subplots(1, 2)
    for label, rs in table.items():
        n = len(rs[0])
        steps = range(1, n + 1)
        ax1.plot(steps, [statistics.median(run[i]["tokens_per_pass"] for run in rs) for i in range(n)],
                 marker="o", label=label)
        ax2.plot(steps, [statistics.median(run[i]["time_rollout_s"] for run in rs) for i in range(n)],
                 marker="o", label=label)
    ax1.set_xlabel("step (epoch 1)")
    ax1.set_ylabel("tokens per pass (median)")
    ax2.set_xlabel("step (epoch 1)")
    ax2.set_ylabel("rollout seconds (median)")
    ax1.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / "ab.png", dpi=110)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2:4], sys.argv[4] if len(sys.argv) == 5 else "Quickstart, epoch 1")
