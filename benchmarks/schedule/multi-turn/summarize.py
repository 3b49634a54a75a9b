"""Summarize the two runs in this folder side by side: the search-agent preset with its turns and
tool calls (search-agent/) and the very same lengths decoded in one piece (single-turn/). Prints a
markdown table, writes summary.png. Usage: python benchmarks/schedule/multi-turn/summarize.py"""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = os.path.dirname(os.path.abspath(__file__))
runs = {}
for name in ("single-turn", "search-agent"):
    with open(os.path.join(HERE, name, "results.json")) as f:
        runs[name] = {r["key"]: r for r in json.load(f)["results"]}
single, multi = runs["single-turn"], runs["search-agent"]

print("| policy | single-turn samples/s | multi-turn samples/s | multi / single | multi-turn vs equal "
      "| multi-turn bubble % | multi-turn recomputed tokens (M) |")
print("|---|---|---|---|---|---|---|")
for key, m in multi.items():
    s = single[key]
    print(f"| {m['policy']} | {s['samples_per_s']:.2f} | {m['samples_per_s']:.2f} | "
          f"{m['samples_per_s'] / s['samples_per_s']:.2f} | {m['samples_per_s'] / multi['equal']['samples_per_s']:.2f}x | "
          f"{100 * m['bubble_ratio']:.1f} | {m['recompute_tokens'] / 1e6:.2f} |")

fig, ax = plt.subplots(figsize=(9, 4))
keys = list(multi)
xs = range(len(keys))
ax.bar([x - 0.2 for x in xs], [single[k]["samples_per_s"] for k in keys], 0.4, label="single-turn (same lengths)",
       color="tab:grey")
ax.bar([x + 0.2 for x in xs], [multi[k]["samples_per_s"] for k in keys], 0.4, label="multi-turn, tool calls",
       color="tab:blue")
ax.set_xticks(list(xs), [multi[k]["policy"].replace(" (", "\n(") for k in keys], fontsize=7, rotation=30, ha="right")
ax.set_ylabel("samples/s")
ax.set_title("synthetic:search-agent, 16 workers, H100/7B roofline: turns and tool latency")
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(HERE, "summary.png"), dpi=120)
