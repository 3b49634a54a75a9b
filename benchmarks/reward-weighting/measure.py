"""Reward-weighted vs frequency-ranked history branches (issue 28, item 5), side by side.

Why: `speculation.reward_weighted` must earn its default. Every row replays the same target
responses through the real native drafter twice, from an index built with reward-weighted and with
frequency-only priorities, and reports tokens per verify step (see rhymerl/tools/bench/acceptance.py
for the replay). Workloads: a run's rollout dumps (each epoch against the previous one), the drafter
bench's synthetic histories, and synthetic groups whose low-reward responses diverge late.

    .venv/bin/python benchmarks/reward-weighting/measure.py --dumps RUN --out benchmarks/reward-weighting
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from rhymerl.algorithms.drafting import HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.tools.bench import report
from rhymerl.tools.bench.draft_replay import ReplayStats, replay_units
from rhymerl.tools.bench.draft_sources import Source, fastest_of_n, histospec, ngram
from rhymerl.tools.bench.draft_workloads import (
    PromptWork,
    dump_workload,
    late_divergence_workload,
    synthetic_workload,
)

KNOBS: dict[str, tuple[SpeculationSpec, bool]] = {  # label: (drafting knobs, group drafts)
    "paper knobs (7->3)": (SpeculationSpec.paper_rule(), False),
    "RLJob defaults (32->1, min_prob 0.5)": (SpeculationSpec(), False),
    "RLJob defaults + group drafts": (SpeculationSpec(), True),
}


def compare(units: list[PromptWork], knobs: SpeculationSpec, groups: bool) -> dict[str, dict[str, float]]:
    """Reward-weighted, frequency, and Fastest-of-N choosing per response between the two (and n-gram)."""
    indexes: dict[str, list[HistoryIndex | None]] = {
        name: [HistoryIndex.build(u.history, reward_weighted=weighted) for u in units]
        for name, weighted in (("reward", True), ("frequency", False))}
    sources: dict[str, Source] = {name: histospec(ix, knobs, name, groups=groups) for name, ix in indexes.items()}
    sources["fastest-of-n"] = fastest_of_n([histospec(indexes["frequency"], knobs, "frequency", groups=groups),
                                            histospec(indexes["reward"], knobs, "reward", groups=groups),
                                            ngram(SpeculationSpec.paper_rule())], knobs)
    row: dict[str, dict[str, float]] = {}
    for name, source in sources.items():
        stats: ReplayStats = replay_units(source, units)
        row[name] = {"tokens": stats.generated, "accepted_fraction": stats.accepted_fraction,
                     "acceptance_rate": stats.acceptance_rate, "tokens_per_step": stats.tokens_per_step}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dumps", type=Path, required=True, help="a run directory with rollout dumps")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    dumps = dump_workload(args.dumps)
    workloads: dict[str, Callable[[], list[PromptWork]]] = {
        f"run dumps, epoch {e - 1}->{e}": partial(lambda e: [u for u in dumps if u.epoch == e], e)
        for e in sorted({u.epoch for u in dumps})
    }
    workloads["drafter bench synthetic (2 x 16 x 4096)"] = partial(synthetic_workload, 2, 16, 4096, seed=0)
    for wrong, right in ((0.75, 0.75), (0.75, 0.5), (0.75, 0.25), (0.5, 0.75)):
        workloads[f"late divergence: {wrong:.0%} slipped, {right:.0%} of targets correct"] = partial(
            late_divergence_workload, wrong_share=wrong, target_correct=right)

    results: dict[str, Any] = {"machine": report.machine(), "dumps": str(args.dumps), "rows": []}
    for name, make in workloads.items():
        units = make()
        for label, (knobs, groups) in KNOBS.items():
            if groups and name.startswith("late"):
                continue  # siblings share the trunk and the slip: group drafts blur what this isolates
            pair = compare(units, knobs, groups)
            row = {"workload": name, "knobs": label, **pair}
            r, f = pair["reward"]["tokens_per_step"], pair["frequency"]["tokens_per_step"]
            fon = pair["fastest-of-n"]["tokens_per_step"]
            print(f"{name:60s} {label:40s} reward {r:.3f}  frequency {f:.3f}  ratio {r / f:.3f}  "
                  f"fastest-of-n {fon:.3f}", flush=True)
            results["rows"].append(row)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = ["| workload | knobs | reward: accepted fraction / tokens per step | frequency: accepted fraction / "
             "tokens per step | reward / frequency | fastest-of-n: accepted fraction / tokens per step |",
             "|---|---|---|---|---|---|"]
    for row in results["rows"]:
        r, f, n = row["reward"], row["frequency"], row["fastest-of-n"]
        lines.append(f"| {row['workload']} | {row['knobs']} | {r['accepted_fraction']:.3f} / {r['tokens_per_step']:.3f} "
                     f"| {f['accepted_fraction']:.3f} / {f['tokens_per_step']:.3f} "
                     f"| {r['tokens_per_step'] / f['tokens_per_step']:.3f} "
                     f"| {n['accepted_fraction']:.3f} / {n['tokens_per_step']:.3f} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")

    rows = results["rows"]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    ys = range(len(rows))
    ax.barh([y + 0.27 for y in ys], [r["reward"]["tokens_per_step"] for r in rows], 0.27, label="reward-weighted")
    ax.barh(list(ys), [r["frequency"]["tokens_per_step"] for r in rows], 0.27, label="frequency")
    ax.barh([y - 0.27 for y in ys], [r["fastest-of-n"]["tokens_per_step"] for r in rows], 0.27,
            label="fastest-of-n (frequency, reward-weighted, n-gram)")
    ax.set_yticks(list(ys), [f"{r['workload']}\n{r['knobs']}" for r in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("tokens per verify step")
    ax.set_title("History branches ranked by summed reward vs by frequency, and Fastest-of-N over both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "reward-weighting.png", dpi=120)


if __name__ == "__main__":
    main()
