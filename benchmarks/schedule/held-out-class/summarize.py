"""Summarize the held-out-class runs in this folder: per preset and seed, each policy's speedup over
the equal split, the default histopipe over async and over the best other policy, and its gap to
the lower bound. Prints a markdown table, writes summary.png.
Usage: python benchmarks/schedule/held-out-class/summarize.py"""
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = os.path.dirname(os.path.abspath(__file__))
PRESETS = ("dapo-math", "vl-video", "code-14b", "search-agent")

runs: dict[str, list[dict[str, dict[str, float]]]] = {}
for preset in PRESETS:
    for path in [os.path.join(HERE, preset, "results.json"),
                 *sorted(glob.glob(os.path.join(HERE, preset + "-seed*", "results.json")))]:
        with open(path) as f:
            doc = json.load(f)
        runs.setdefault(preset, []).append({r["key"]: r for r in doc["table"]})

print("| preset | seed | equal s/step | async vs equal | histopipe per-worker vs equal | histopipe vs equal "
      "| histopipe / async | histopipe / best other policy | histopipe over bound % | steady over bound % |")
print("|---|---|---|---|---|---|---|---|---|---|")
for preset, seeds in runs.items():
    for seed, t in enumerate(seeds):
        other = max((k for k in t if k != "histopipe"), key=lambda k: t[k]["speedup"])
        h = t["histopipe"]
        print(f"| {preset} | {seed} | {t['equal']['time_per_step_s']:.1f} | {t['async']['speedup']:.2f}x | "
              f"{t['histopipe-perworker']['speedup']:.2f}x | {h['speedup']:.2f}x | "
              f"{h['speedup'] / t['async']['speedup']:.2f} | {h['speedup'] / t[other]['speedup']:.2f} ({other}) | "
              f"{h['gap_to_bound_pct']:.1f} | {h['steady_gap_to_bound_pct']:.1f} |")

fig, ax = plt.subplots(figsize=(8, 4))
for i, preset in enumerate(runs):
    keys = (("async", "tab:orange"), ("histopipe-perworker", "tab:grey"), ("histopipe", "tab:blue"), ("lpt", "tab:green"))
    for j, (key, colour) in enumerate(keys):
        values = [t[key]["speedup"] for t in runs[preset] if key in t]
        ax.scatter([i + (j - 1.5) * 0.18] * len(values), values, color=colour, label=key if i == 0 else None)
ax.axhline(1.0, color="grey", lw=0.8)
ax.set_xticks(range(len(runs)), list(runs))
ax.set_ylabel("samples/s over the equal split")
ax.set_title("held-out class: 16 workers, 8 groups, seeds 0-2 (lpt: seed 0 only)")
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(HERE, "summary.png"), dpi=110)
