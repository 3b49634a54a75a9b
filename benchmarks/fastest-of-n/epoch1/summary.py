"""Per run: tokens per pass, rollout seconds and each draft source's mean share, from the metrics files
here; writes epoch1.png beside them.

PYTHONSAFEPATH=1 python benchmarks/fastest-of-n/epoch1/summary.py
"""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

HERE = Path(__file__).parent

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

# Fastest-of-N pricing the draft model's steps (priced.sh): history and fastest-of-n + draft model,
# interleaved, each repeat a fresh one-epoch run
priced: dict[str, list[tuple[float, float, float]]] = {}
for path in sorted(HERE.glob("priced-*.metrics.jsonl")):
    name = path.name.removeprefix("priced-").removesuffix(".metrics.jsonl").rsplit("-", 1)[0]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    tokens = sum(r["rollout_tokens"] for r in rows)
    passes = sum(r["rollout_tokens"] / r["tokens_per_pass"] for r in rows)
    drafting = [r.get("spec_sources") or {} for r in rows]
    share = sum(d.get("draft-model", {}).get("share", 0.0) for d in drafting) / len(rows)
    priced.setdefault(name, []).append((sum(r["time_rollout_s"] for r in rows), tokens / passes, share))
if priced:
    print()
    print("| run | repeats | rollout s (each) | rollout s (median) | tokens per pass | draft-model share |")
    print("|---|---|---|---|---|---|")
    for name, runs in priced.items():
        seconds = sorted(r[0] for r in runs)
        median = seconds[len(seconds) // 2] if len(seconds) % 2 else sum(seconds[len(seconds) // 2 - 1:][:2]) / 2
        print(f"| {name} | {len(runs)} | {' / '.join(f'{r[0]:.1f}' for r in runs)} | {median:.1f} | "
              f"{sum(r[1] for r in runs) / len(runs):.2f} | {sum(r[2] for r in runs) / len(runs):.3f} |")
    fig = Figure(figsize=(5, 3.5))
    ax = fig.subplots()
    names = list(priced)
    for i, name in enumerate(names):
        ax.scatter([i] * len(priced[name]), [r[0] for r in priced[name]], color="tab:orange")
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("rollout seconds, epoch 1 (8 steps)")
    ax.set_ylim(bottom=0)
    fig.suptitle("fastest-of-n + draft model, its steps priced, against history")
    fig.tight_layout()
    fig.savefig(HERE / "epoch1-priced.png", dpi=120)
