"""Tabulate run.sh's runs: per historyEpochs K and epoch, tokens per pass (the epoch's tokens over
its passes) and rollout seconds (the sum over its steps), medians over the repeats; whether every
run generated the same responses; and a plot per epoch (history-epochs.png).

python benchmarks/history-epochs/summary.py   (reads k*-*.metrics.jsonl beside it)
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from matplotlib.figure import Figure

HERE = Path(__file__).resolve().parent


def runs() -> dict[int, list[list[dict[str, float]]]]:
    out: dict[int, list[list[dict[str, float]]]] = {}
    for p in sorted(HERE.glob("k*-*.metrics.jsonl")):
        match = re.match(r"k(\d+)-", p.name)
        assert match is not None
        out.setdefault(int(match.group(1)), []).append([json.loads(line) for line in p.read_text().splitlines()])
    return dict(sorted(out.items()))


def per_epoch(run: list[dict[str, float]]) -> dict[int, tuple[float, float]]:
    """epoch -> (tokens per pass, rollout seconds)."""
    out = {}
    for epoch in sorted({int(r["epoch"]) for r in run}):
        rows = [r for r in run if r["epoch"] == epoch]
        tokens = sum(r["rollout_tokens"] for r in rows)
        passes = sum(r["rollout_tokens"] / r["tokens_per_pass"] for r in rows)
        out[epoch] = (tokens / passes, sum(r["time_rollout_s"] for r in rows))
    return out


def main() -> None:
    table = runs()
    responses = {p.name: p.read_text().strip() for p in sorted(HERE.glob("*.responses.sha256"))}
    print(f"{len(responses)} runs, responses identical across all of them: {len(set(responses.values())) == 1}")
    epochs = sorted(per_epoch(next(iter(table.values()))[0]))
    medians: dict[int, dict[int, tuple[float, float]]] = {}
    for k, rs in table.items():
        each = [per_epoch(run) for run in rs]
        medians[k] = {e: (statistics.median(x[e][0] for x in each), statistics.median(x[e][1] for x in each))
                      for e in epochs}
    print("tokens per pass (median over repeats)")
    print("| historyEpochs | runs | " + " | ".join(f"epoch {e}" for e in epochs) + " |")
    print("|---|---|" + "---|" * len(epochs))
    for k, rs in table.items():
        print(f"| {k} | {len(rs)} | " + " | ".join(f"{medians[k][e][0]:.2f}" for e in epochs) + " |")
    print("rollout seconds (median over repeats; epochs 2 on summed in the last column)")
    print("| historyEpochs | " + " | ".join(f"epoch {e}" for e in epochs) + " | epochs 2-5 |")
    print("|---|" + "---|" * (len(epochs) + 1))
    for k in table:
        later = sum(medians[k][e][1] for e in epochs[1:])
        print(f"| {k} | " + " | ".join(f"{medians[k][e][1]:.2f}" for e in epochs) + f" | {later:.2f} |")
    fig = Figure(figsize=(9, 4))
    ax1, ax2 = fig.subplots(1, 2)
    for k in table:
        ax1.plot(epochs, [medians[k][e][0] for e in epochs], marker="o", label=f"historyEpochs {k}")
        ax2.plot(epochs, [medians[k][e][1] for e in epochs], marker="o", label=f"historyEpochs {k}")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("tokens per pass (median)")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("rollout seconds (median)")
    ax1.axhline(4.0, color="grey", linestyle=":", linewidth=1)
    ax1.legend()
    fig.suptitle("Quickstart: each prompt drafting from its last K epochs")
    fig.tight_layout()
    fig.savefig(HERE / "history-epochs.png", dpi=110)


if __name__ == "__main__":
    main()
