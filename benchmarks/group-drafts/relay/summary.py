"""Tabulate ray.sh's runs: per relay setting, tokens per pass and rollout seconds of epoch 1
(medians over the repeats of each run's mean and sum), and a plot per step.

python benchmarks/group-drafts/relay/summary.py   (reads ray-*.metrics.jsonl beside it, writes ray.png)
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from matplotlib.figure import Figure

HERE = Path(__file__).resolve().parent


def runs(relay: str) -> list[list[dict[str, float]]]:
    return [[json.loads(line) for line in p.read_text().splitlines()]
            for p in sorted(HERE.glob(f"ray-{relay}-*.metrics.jsonl"))]


def main() -> None:
    table = {relay: runs(relay) for relay in ("on", "off")}
    print("| relay | runs | tokens per pass (median of run means) | rollout s (median of run sums) | worker busy s |")
    print("|---|---|---|---|---|")
    for relay, rs in table.items():
        tpp = statistics.median(statistics.mean(r["tokens_per_pass"] for r in run) for run in rs)
        secs = statistics.median(sum(r["time_rollout_s"] for r in run) for run in rs)
        busy = statistics.median(sum(sum(r["rollout_busy_s"]) for r in run) for run in rs)
        print(f"| {relay} | {len(rs)} | {tpp:.3f} | {secs:.2f} | {busy:.2f} |")
    fig = Figure(figsize=(9, 4))
    ax1, ax2 = fig.subplots(1, 2)
    for relay, rs in table.items():
        steps = range(1, len(rs[0]) + 1)
        ax1.plot(steps, [statistics.median(run[i]["tokens_per_pass"] for run in rs) for i in range(len(rs[0]))],
                 marker="o", label=f"relay {relay}")
        ax2.plot(steps, [statistics.median(run[i]["time_rollout_s"] for run in rs) for i in range(len(rs[0]))],
                 marker="o", label=f"relay {relay}")
    ax1.set_xlabel("step (epoch 1)")
    ax1.set_ylabel("tokens per pass (median)")
    ax2.set_xlabel("step (epoch 1)")
    ax2.set_ylabel("rollout seconds (median)")
    ax1.legend()
    fig.suptitle("Quickstart epoch 1 on 2 Ray rollout workers: group drafts with and without the relay")
    fig.tight_layout()
    fig.savefig(HERE / "ray.png", dpi=110)


if __name__ == "__main__":
    main()
