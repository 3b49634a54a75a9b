"""Tabulate and plot the GPU benches of this folder: speedup over plain decoding and tokens per
pass by method, per epoch generated (each epoch's methods ran interleaved in one bench).

python benchmarks/gpu/sources/summary.py   (reads h200/*/results.json, writes h200/by_epoch.png)
"""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

HERE = Path(__file__).resolve().parent / "h200"
BENCHES = ("epoch1", "epoch1-sources", "epoch2", "epoch6")


def main() -> None:
    rows = {b: json.loads((HERE / b / "results.json").read_text()) for b in BENCHES}
    print("| bench | epoch | method | seconds | speedup | tokens per pass | acceptance |")
    print("|---|---|---|---|---|---|---|")
    for bench, rs in rows.items():
        for r in rs:
            print(f"| {bench} | {r['epoch']} | {r['method']} | {r['seconds']:.2f} | {r['speedup']:.2f} | "
                  f"{r['tokens_per_pass']:.2f} | {r['acceptance'] if r['acceptance'] is not None else '-'} |")
    methods = list(dict.fromkeys(r["method"] for rs in rows.values() for r in rs if r["method"] != "none"))
    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        xs, speed, tpp = [], [], []
        for j, rs in enumerate(rows.values()):
            row = next((r for r in rs if r["method"] == m), None)
            if row is not None:
                xs.append(j + i * width)
                speed.append(row["speedup"])
                tpp.append(row["tokens_per_pass"])
        ax1.bar(xs, speed, width, label=m)
        ax2.bar(xs, tpp, width, label=m)
    labels = [f"{b}\n(epoch {rs[0]['epoch']})" for b, rs in rows.items()]
    for ax, what in ((ax1, "rollout speedup vs plain"), (ax2, "tokens per verify pass")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], labels, fontsize=8)
        ax.set_ylabel(what)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.grid(axis="y", alpha=0.3)
    ax1.legend(fontsize=7)
    fig.suptitle("the quickstart's steps on an NVIDIA H200 (torch engine), by epoch generated")
    fig.tight_layout()
    fig.savefig(HERE / "by_epoch.png", dpi=110)


if __name__ == "__main__":
    main()
