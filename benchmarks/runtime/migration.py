"""HistoPipe's outlier migration between Ray rollout workers, measured side by side: the quickstart
job on two Ray rollout workers, pipelined (`max_off_policy_steps: 1`, so an outlier of a long
group may be deferred to the next round), `scheduling.migration.enabled` on and off, runs
interleaved (the order flips every repeat). Work stealing stays on in both (the default). Per run:
wall time, the controller's median wait for rollout per step, the rounds' median bubble ratio,
outliers moved within a round and deferred to the next, the largest policy lag of a trained
group; every run is checked to have trained each (epoch, prompt, sample) exactly once, each group
from one policy version.

Usage: python benchmarks/runtime/migration.py OUT_DIR [--epochs N] [--repeats N]
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

from rhymerl.workers import dumps

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import metrics, side_by_side  # the runtime bench's own job runner

BASE = ["backend=ray", "rollout.replicas=2", "rollout.max_replicas=2", "algorithm.max_off_policy_steps=1"]
SETTINGS = {"migration": ["scheduling.migration.enabled=true"], "no migration": ["scheduling.migration.enabled=false"]}


def exactly_once(out: Path) -> int:
    """The number of responses trained, after checking each was trained once, each group from one version."""
    recs = dumps.read_run(out)
    keys = [(r.epoch, r.prompt_id, r.sample_index) for r in recs]
    if len(keys) != len(set(keys)):
        raise SystemExit(f"{out}: a response trained twice")
    versions: dict[tuple[int, str], set[int]] = {}
    for r in recs:
        versions.setdefault((r.epoch, r.prompt_id), set()).add(r.policy_version)
    if any(len(v) != 1 for v in versions.values()):
        raise SystemExit(f"{out}: a group from several policy versions")
    return len(keys)


def summary(out: Path, wall: float) -> dict[str, float]:
    rows = metrics(out)
    return {"wall_s": wall,
            "wait_rollout_s": statistics.median(float(str(r["time_wait_rollout_s"])) for r in rows),
            "bubble": statistics.median(float(str(r["rollout_bubble"])) for r in rows),
            "migrated": float(sum(int(str(r["rollout_migrated"])) for r in rows)),
            "deferred": float(sum(int(str(r["rollout_deferred"])) for r in rows)),
            "stolen": float(sum(int(str(r["rollout_stolen"])) for r in rows)),
            "lag_max": float(max(int(str(r["policy_lag_max"])) for r in rows)),
            "responses": float(exactly_once(out))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs, _ = side_by_side(SETTINGS, BASE, args.epochs, args.repeats, summary, keep=lambda out: None)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    result = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "epochs": args.epochs,
              "repeats": args.repeats, "runs": runs, "medians": med}
    (args.out / "migration.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["| setting | wall s | controller waits for rollout, median s/step | bubble, median | moved within "
             "a round | deferred to the next | stolen | max policy lag | responses trained once |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, m in med.items():
        lines.append(f"| {name} | {m['wall_s']:.1f} | {m['wait_rollout_s']:.2f} | {m['bubble']:.3f} | "
                     f"{m['migrated']:.0f} | {m['deferred']:.0f} | {m['stolen']:.0f} | {m['lag_max']:.0f} | "
                     f"{m['responses']:.0f} |")
    (args.out / "migration.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig = Figure(figsize=(7, 3.5))
    ax1, ax2 = fig.subplots(1, 2)
    names = list(med)
    ax1.bar(names, [m["wait_rollout_s"] for m in med.values()], color=["tab:green", "tab:gray"])
    ax1.set_ylabel("waits for rollout, median s/step")
    ax2.bar(names, [m["bubble"] for m in med.values()], color=["tab:green", "tab:gray"])
    ax2.set_ylabel("bubble ratio, median")
    fig.suptitle("Two Ray rollout workers, off-policy 1: outlier migration on/off")
    fig.tight_layout()
    fig.savefig(args.out / "migration.png", dpi=120)


if __name__ == "__main__":
    main()
