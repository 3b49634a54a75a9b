"""Per run: tokens per pass, rollout seconds and each draft source's mean share, from the metrics files
here; writes epoch1.png beside them.

PYTHONSAFEPATH=1 python benchmarks/fastest-of-n/epoch1/summary.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent

from matplotlib.figure import Figure

bars: dict[str, tuple[float, float]] = {}
print("| run | steps | tokens per pass | rollout s | train s | share of drafting passes by source |")
print("|---|---|---|---|---|---|")
for name in ("history", "fastest-of-n", "fastest-of-n-draft"):
    rows = [json.loads(line) for line in (HERE / f"{name}.metrics.jsonl").read_text().splitlines()]
    tokens = sum(r["rollout_tokens"] for r in rows)
    passes = sum(r["rollout_tokens"] / r["tokens_per_pass"] for r in rows)
    shares: dict[str, list[float]] = {}
    for r in rows:
        for source, v in (r.get("spec_sources") or {}).items():
            shares.setdefault(source, []).append(v["share"])
    bars[name] = (tokens / passes, sum(r["time_rollout_s"] for r in rows))
    split = ", ".join(f"{s} {sum(v) / len(v):.3f}" for s, v in shares.items())
    print(f"| {name} | {len(rows)} | {tokens / passes:.2f} | {sum(r['time_rollout_s'] for r in rows):.1f} | "
          f"{sum(r['time_train_s'] for r in rows):.1f} | {split} |")

fig = Figure(figsize=(8, 3.5))
left, right = fig.subplots(1, 2)
left.bar(list(bars), [v[0] for v in bars.values()], color="tab:blue")
left.set_ylabel("tokens per pass, epoch 1")
right.bar(list(bars), [v[1] for v in bars.values()], color="tab:orange")
right.set_ylabel("rollout seconds, epoch 1 (8 steps)")
for ax in (left, right):
    ax.tick_params(axis="x", labelsize=8)
fig.suptitle("quickstart epoch 1 on a 2-core CPU: group drafts, + n-gram, + draft model (fastest-of-n)")
fig.tight_layout()
fig.savefig(HERE / "epoch1.png", dpi=120)
