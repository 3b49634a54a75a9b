"""Tabulate run.sh's runs: per setting, epoch 1's tokens per pass (all its tokens over all its
passes) and rollout seconds (the sum over its steps), as medians over the repeats; whether every
run generated the same responses; and a plot per step (recent.png).

python benchmarks/group-drafts/recent/summary.py   (reads {on,off}-*.metrics.jsonl beside it)
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from matplotlib.figure import Figure

HERE = Path(__file__).resolve().parent
LABEL = {"on": "recent responses + group", "off": "group only (recentTokens 0)"}


def runs(mode: str) -> list[list[dict[str, float]]]:
    return [[json.loads(line) for line in p.read_text().splitlines()]
            for p in sorted(HERE.glob(f"{mode}-*.metrics.jsonl"))]


def tokens_per_pass(run: list[dict[str, float]]) -> float:
    tokens = sum(r["rollout_tokens"] for r in run)
    return tokens / sum(r["rollout_tokens"] / r["tokens_per_pass"] for r in run)


def main() -> None:
    table = {mode: runs(mode) for mode in ("on", "off")}
    responses = {p.name: p.read_text().strip() for p in sorted(HERE.glob("*.responses.sha256"))}
    same = len(set(responses.values())) == 1
    print(f"{len(responses)} runs, responses identical across all of them: {same}")
    print("| drafts from | runs | tokens per pass (median) | rollout s (median of sums) | each run's rollout s |")
    print("|---|---|---|---|---|")
    medians = {}
    for mode, rs in table.items():
        tpp = statistics.median(tokens_per_pass(run) for run in rs)
        sums = [sum(r["time_rollout_s"] for r in run) for run in rs]
        medians[mode] = statistics.median(sums)
        print(f"| {LABEL[mode]} | {len(rs)} | {tpp:.3f} | {medians[mode]:.2f} | "
              f"{', '.join(f'{s:.2f}' for s in sums)} |")
    print(f"rollout time, recent / group only: {medians['on'] / medians['off']:.3f}")
    fig = Figure(figsize=(9, 4))
    ax1, ax2 = fig.subplots(1, 2)
    for mode, rs in table.items():
        n = len(rs[0])
        steps = range(1, n + 1)
        ax1.plot(steps, [statistics.median(run[i]["tokens_per_pass"] for run in rs) for i in range(n)],
                 marker="o", label=LABEL[mode])
        ax2.plot(steps, [statistics.median(run[i]["time_rollout_s"] for run in rs) for i in range(n)],
                 marker="o", label=LABEL[mode])
    ax1.set_xlabel("step (epoch 1)")
    ax1.set_ylabel("tokens per pass (median)")
    ax2.set_xlabel("step (epoch 1)")
    ax2.set_ylabel("rollout seconds (median)")
    ax1.legend()
    fig.suptitle("Quickstart epoch 1: drafts from the run's recent responses to other prompts")
    fig.tight_layout()
    fig.savefig(HERE / "recent.png", dpi=110)


if __name__ == "__main__":
    main()
