"""Work stealing between Ray rollout workers, measured side by side: the quickstart job on two
Ray rollout workers (`rollout.replicas: 2`, off-policy 0) with `scheduling.work_stealing` on and
off, runs interleaved (the order flips every repeat). Per run: wall time, the controller's median
wait for rollout per step, the rounds' bubble ratio (idle share of workers x makespan, from each
worker's busy seconds) and the samples stolen; tokens compared between the two settings.

Usage: python benchmarks/runtime/stealing.py OUT_DIR [--epochs N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import metrics, side_by_side, tokens  # the runtime bench's own job runner

BASE = ["backend=ray", "rollout.replicas=2", "rollout.max_replicas=2", "algorithm.max_off_policy_steps=0"]
SETTINGS = {"stealing": ["scheduling.work_stealing=true"], "no stealing": ["scheduling.work_stealing=false"]}


def summary(out: Path, wall: float) -> dict[str, float]:
    rows = metrics(out)
    return {"wall_s": wall,
            "wait_rollout_s": statistics.median(float(r["time_wait_rollout_s"]) for r in rows),
            "bubble": statistics.median(float(r["rollout_bubble"]) for r in rows),
            "stolen": float(sum(int(r["rollout_stolen"]) for r in rows)),
            "resumed_tokens": float(sum(int(r["rollout_resumed_tokens"]) for r in rows))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs, responses = side_by_side(SETTINGS, BASE, args.epochs, args.repeats, summary, tokens)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    same = responses["stealing"] == responses["no stealing"]
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "epochs": args.epochs,
              "repeats": args.repeats, "runs": runs, "medians": med, "tokens_identical": same}
    (args.out / "stealing.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["| setting | wall s | controller waits for rollout, median s/step | bubble, median | samples "
             "stolen | tokens carried |", "|---|---:|---:|---:|---:|---:|"]
    for name, m in med.items():
        lines.append(f"| {name} | {m['wall_s']:.1f} | {m['wait_rollout_s']:.2f} | {m['bubble']:.3f} | "
                     f"{m['stolen']:.0f} | {m['resumed_tokens']:.0f} |")
    lines.append(f"\nTokens identical with and without stealing: **{same}**")
    (args.out / "stealing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    ax.bar(list(med), [m["wait_rollout_s"] for m in med.values()], color=["tab:green", "tab:gray"])
    ax.set_ylabel("controller waits for rollout, median s/step")
    ax.set_title("Two Ray rollout workers, work stealing on/off")
    fig.tight_layout()
    fig.savefig(args.out / "stealing.png", dpi=120)


if __name__ == "__main__":
    main()
