"""results.json (bench.py) -> table.md and scale.png: API calls per minute at rest and memory, per job count."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent


def main() -> None:
    rows = json.loads((HERE / "results.json").read_text())
    lines = ["| RLJobs | cache | converged | API calls/min at rest | writes at rest | RLJob GETs at rest | "
             "operator RSS (MiB) | operator CPU at rest (s/min) |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        cpu = r.get("cpu_s_per_min_at_rest")
        lines.append(f"| {r['jobs']} | {'informers' if r['cached'] else 'none (before)'} | "
                     f"{'yes' if r['converged'] else 'no (cap)'} in {r['converge_s']:.0f} s | "
                     f"{r['calls_per_min_at_rest']:.0f} | {r['writes_at_rest']} | {r['uncached_passes_at_rest']} | "
                     f"{r['rss_mib']:.0f} | {'-' if cpu is None else f'{cpu:.1f}'} |")
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    sizes = sorted({r["jobs"] for r in rows})
    fig, (calls, memory, cpu) = plt.subplots(1, 3, figsize=(14, 4))
    width = 0.38
    for i, cached in enumerate((False, True)):
        picked = [r for n in sizes for r in rows if r["jobs"] == n and r["cached"] == cached]
        label = "informer cache" if cached else "no cache (before)"
        xs = [sizes.index(r["jobs"]) + (i - 0.5) * width for r in picked]  # a mode not measured: no bar
        calls.bar(xs, [max(r["calls_per_min_at_rest"], 0.1) for r in picked], width, label=label)
        memory.bar(xs, [r["rss_mib"] for r in picked], width, label=label)
        cpu.bar(xs, [r.get("cpu_s_per_min_at_rest", 0.0) for r in picked], width, label=label)
        for x, r in zip(xs, picked, strict=True):  # the real value (0 is drawn at 0.1 on the log axis)
            calls.annotate(f"{r['calls_per_min_at_rest']:.0f}", (x, max(r["calls_per_min_at_rest"], 0.1)),
                           ha="center", va="bottom")
            memory.annotate(f"{r['rss_mib']:.0f}", (x, r["rss_mib"]), ha="center", va="bottom")
            if "cpu_s_per_min_at_rest" in r:
                cpu.annotate(f"{r['cpu_s_per_min_at_rest']:.1f}", (x, r["cpu_s_per_min_at_rest"]), ha="center",
                             va="bottom")
    for ax, title in ((calls, "API calls per minute at rest (log)"), (memory, "operator RSS (MiB)"),
                      (cpu, "operator CPU s per minute at rest")):
        ax.set_xticks(range(len(sizes)), [f"{n} RLJobs" for n in sizes])
        ax.set_title(title)
        ax.legend()
    calls.set_yscale("log")
    fig.tight_layout()
    fig.savefig(HERE / "scale.png", dpi=110)


if __name__ == "__main__":
    main()
