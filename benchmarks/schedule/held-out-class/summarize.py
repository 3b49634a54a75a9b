"""Summarize the held-out-class runs in this folder: per preset and seed, each policy's speedup over
the equal split, and histopipe over async. Prints a markdown table, writes summary.png.
Usage: python benchmarks/schedule/held-out-class/summarize.py"""
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PRESETS = ("dapo-math", "vl-video", "code-14b", "search-agent")

runs: dict[str, list[dict[str, dict[str, float]]]] = {}
for preset in PRESETS:
    for path in [os.path.join(HERE, preset, "results.json"),
                 *sorted(glob.glob(os.path.join(HERE, preset + "-seed*", "results.json")))]:
        with open(path) as f:
            doc = json.load(f)
        runs.setdefault(preset, []).append({r["key"]: r for r in doc["table"]})

print("| preset | seed | equal s/step | async vs equal | histopipe vs equal | histopipe / async | best histopipe variant / async |")
print("|---|---|---|---|---|---|---|")
for preset, seeds in runs.items():
    for seed, t in enumerate(seeds):
        best = max((k for k in t if k.startswith("histopipe")), key=lambda k: t[k]["speedup"])
        print(f"| {preset} | {seed} | {t['equal']['time_per_step_s']:.1f} | {t['async']['speedup']:.2f}x | "
              f"{t['histopipe']['speedup']:.2f}x | {t['histopipe']['speedup'] / t['async']['speedup']:.2f} | "
              f"{best} {t[best]['speedup'] / t['async']['speedup']:.2f} |")

fig, ax = plt.subplots(figsize=(8, 4))
for i, preset in enumerate(runs):
    for j, (key, colour) in enumerate((("async", "tab:orange"), ("histopipe", "tab:blue"), ("lpt", "tab:green"))):
        values = [t[key]["speedup"] for t in runs[preset] if key in t]
        ax.scatter([i + (j - 1) * 0.2] * len(values), values, color=colour, label=key if i == 0 else None)
ax.axhline(1.0, color="grey", lw=0.8)
ax.set_xticks(range(len(runs)), list(runs))
ax.set_ylabel("samples/s over the equal split")
ax.set_title("held-out class: 16 workers, 8 groups, seeds 0-2 (lpt: seed 0 only)")
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(HERE, "summary.png"), dpi=110)
