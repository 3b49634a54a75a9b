"""The default policy against every other one, per committed `rhymerl bench schedule` run (issue 27:
"one default that is never worse"): samples/s of the default `histopipe` over the best other row,
over `async` and over HistoPipe's per-worker placement, and its gaps to the lower bound. Prints a
markdown table, writes default_summary.png.
Usage: python benchmarks/schedule/default_summary.py"""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = [
    ("synthetic:math", "."),
    ("synthetic:code", "code"),
    ("quickstart trace (CPU profile, 4 workers)", "torch-cpu/quickstart"),
    ("quickstart-shaped math (CPU profile)", "torch-cpu/math-scaled"),
    ("external trace, no ids", "external"),
    *[(f"synthetic:math, {n} prompts a step", f"load-{n}") for n in (128, 256, 512)],
    *[(f"{p} seed {s}", f"held-out-class/{p}" + (f"-seed{s}" if s else ""))
      for p in ("dapo-math", "vl-video", "code-14b", "search-agent") for s in (0, 1, 2)],
]

rows = []
print("| trace | default s/step | vs best other policy | vs async | vs per-worker placement | over bound % "
      "| steady over bound % |")
print("|---|---|---|---|---|---|---|")
for name, folder in RUNS:
    with open(os.path.join(HERE, folder, "results.json")) as f:
        table = {r["key"]: r for r in json.load(f)["table"]}
    d = table["histopipe"]
    other = max((k for k in table if k != "histopipe"), key=lambda k: table[k]["samples_per_s"])
    best = d["samples_per_s"] / table[other]["samples_per_s"]
    vs_async = d["samples_per_s"] / table["async"]["samples_per_s"]
    vs_pw = d["samples_per_s"] / table["histopipe-perworker"]["samples_per_s"]
    rows.append((name, best, vs_async, vs_pw))
    print(f"| {name} | {d['time_per_step_s']:.1f} | {best:.3f} ({other}) | {vs_async:.2f} | {vs_pw:.2f} | "
          f"{d['gap_to_bound_pct']:.1f} | {d['steady_gap_to_bound_pct']:.1f} |")

fig, ax = plt.subplots(figsize=(9, 4.5))
x = range(len(rows))
ax.bar([i - 0.27 for i in x], [r[1] for r in rows], 0.27, label="over the best other policy")
ax.bar(list(x), [r[2] for r in rows], 0.27, label="over async")
ax.bar([i + 0.27 for i in x], [r[3] for r in rows], 0.27, label="over per-worker HistoPipe")
ax.axhline(1.0, color="grey", lw=0.8)
ax.set_xticks(list(x), [r[0] for r in rows], rotation=60, ha="right", fontsize=7)
ax.set_ylabel("samples/s ratio of the default")
ax.set_title("default histopipe (shared queue) vs every other policy, per trace")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "default_summary.png"), dpi=110)
