"""An elastic rollout fleet against a fixed one, measured side by side: the quickstart job (cut to
`--epochs`, off-policy 0) on 2 rollout workers throughout, and on 2 that become 4 after step
`--grow` and 2 again after step `--shrink` (`rhymerl scale`, forced at those steps with hold points:
the same steps every run). Per phase (before, while 4, after): rollout time per step and the
rollout makespan per step (from a round's start until its last worker finished: on in-process
workers the time N devices running these passes would see, on Ray workers the wall clock of
workers sharing this machine's cores), and what the fleet moved: samples stolen by the joiners,
handed back by the leavers, tokens carried. Runs are interleaved (the order flips every repeat);
medians over repeats. Tokens are compared between the two fleets.

Usage: python benchmarks/runtime/elastic.py OUT_DIR [--epochs N] [--repeats N] [--backends local,ray]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import REPO, SCRIPT, metrics, tokens  # the runtime bench's own readers

BASE = ["rollout.replicas=2", "rollout.max_replicas=4", "algorithm.max_off_policy_steps=0"]


def run(out: Path, backend: str, epochs: int, grow: int | None, shrink: int | None) -> float:
    """One run; with `grow` and `shrink`, scaled to 4 workers after step `grow` and to 2 after `shrink`."""
    holds = out.with_name(out.name + "-holds")
    holds.mkdir(parents=True)
    env = dict(os.environ)
    if grow is not None and shrink is not None:
        env |= {"RHYMERL_HOLD_AT": f"metrics:{grow},metrics:{shrink}", "RHYMERL_HOLD_DIR": str(holds)}
    cmd = [str(SCRIPT), "run", str(REPO / "examples" / "quickstart.yaml"), "--out", str(out),
           *(a for s in [*BASE, f"backend={backend}", f"algorithm.epochs={epochs}"] for a in ("--set", s))]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=tempfile.gettempdir(), env=env)
    for step, workers in ((grow, 4), (shrink, 2)):
        if step is None:
            continue
        while not (holds / f"metrics-{step}.reached").exists():
            if proc.poll() is not None:
                raise SystemExit(f"{' '.join(cmd)} ended early:\n{proc.communicate()[1][-3000:]}")
            time.sleep(0.1)
        subprocess.run([str(SCRIPT), "scale", str(out), "--rollout", str(workers)], check=True, capture_output=True)
        (holds / f"metrics-{step}.go").touch()
    if proc.wait() != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.communicate()[1][-3000:]}")
    return time.perf_counter() - t0


def phases(rows: list[dict[str, object]], grow: int, shrink: int) -> dict[str, dict[str, float]]:
    """Medians per phase of the elastic run's steps (the fixed run's same steps)."""
    cut = {"2 workers (before)": [r for r in rows if int(str(r["step"])) <= grow],
           "4 workers": [r for r in rows if grow < int(str(r["step"])) <= shrink],
           "2 workers (after)": [r for r in rows if int(str(r["step"])) > shrink]}

    def med(rs: list[dict[str, object]], key: str) -> float:
        return statistics.median(float(str(r[key])) for r in rs) if rs else float("nan")

    return {name: {"steps": len(rs), "rollout_s": med(rs, "time_rollout_s"), "makespan_s": med(rs, "rollout_makespan_s"),
                   "step_s": med(rs, "time_step_s"), "workers": med(rs, "rollout_workers")}
            for name, rs in cut.items()}


def moved(rows: list[dict[str, object]]) -> dict[str, int]:
    return {k: sum(int(str(r[f"rollout_{k}"])) for r in rows)
            for k in ("stolen", "handed_back", "migrated", "resumed_tokens")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--grow", type=int, default=2)
    ap.add_argument("--shrink", type=int, default=5)
    ap.add_argument("--backends", default="local,ray")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {"fixed 2": (None, None), "2 -> 4 -> 2": (args.grow, args.shrink)}
    backends = args.backends.split(",")
    result: dict[str, object] = {
        "command": " ".join(["python", *sys.argv]), "epochs": args.epochs, "repeats": args.repeats,
        "grow_after_step": args.grow, "shrink_after_step": args.shrink,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "backends": {}}
    lines = []
    per_step: dict[str, dict[str, list[list[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            runs: dict[str, list[list[dict[str, object]]]] = {k: [] for k in settings}
            walls: dict[str, list[float]] = {k: [] for k in settings}
            responses: dict[str, object] = {}
            for rep in range(args.repeats):
                for name in (list(settings) if rep % 2 == 0 else list(settings)[::-1]):
                    out = Path(tmp) / f"{backend}-{name.replace(' ', '').replace('>', '')}-{rep}"
                    wall = run(out, backend, args.epochs, *settings[name])
                    walls[name].append(wall)
                    runs[name].append(metrics(out))
                    responses.setdefault(name, tokens(out))
                    print(f"{backend} run {rep + 1}/{args.repeats} {name}: {wall:.1f}s", flush=True)
            same = responses["fixed 2"] == responses["2 -> 4 -> 2"]
            summary = {name: {"wall_s": round(statistics.median(walls[name]), 1),
                              "phases": {ph: {k: round(statistics.median(r[ph][k] for r in
                                                                          [phases(rows, args.grow, args.shrink)
                                                                           for rows in runs[name]]), 3)
                                              for k in ("steps", "rollout_s", "makespan_s", "step_s", "workers")}
                                         for ph in phases(runs[name][0], args.grow, args.shrink)},
                              "moved": moved(runs[name][-1])}
                       for name in settings}
            result["backends"][backend] = {"settings": summary, "tokens_identical": same}  # type: ignore[index]
            per_step[backend] = {name: [[float(str(r["rollout_makespan_s"])) for r in rows] for rows in runs[name]]
                                 for name in settings}
            lines += [f"### backend {backend} (tokens identical: {same})", "",
                      "| fleet | phase | steps | workers | rollout s/step | makespan s/step | step s | stolen | "
                      "handed back | tokens carried |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for name, s in summary.items():
                for ph, v in s["phases"].items():  # type: ignore[attr-defined]
                    mv = s["moved"]
                    lines.append(f"| {name} | {ph} | {v['steps']:.0f} | {v['workers']:.0f} | {v['rollout_s']:.2f} | "
                                 f"{v['makespan_s']:.2f} | {v['step_s']:.2f} | {mv['stolen']} | "  # type: ignore[index]
                                 f"{mv['handed_back']} | {mv['resumed_tokens']} |")  # type: ignore[index]
            lines.append("")
    (args.out / "elastic.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "elastic.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig = Figure(figsize=(4.5 * len(backends), 4))
    for i, backend in enumerate(backends):
        ax = fig.add_subplot(1, len(backends), i + 1)
        for name, reps in per_step[backend].items():
            steps = range(1, len(reps[0]) + 1)
            ax.plot(steps, [statistics.median(r[j] for r in reps) for j in range(len(reps[0]))], marker=".",
                    label=name)
        ax.axvspan(args.grow + 0.5, args.shrink + 0.5, alpha=0.1, label="4 workers wanted")
        ax.set_xlabel("step")
        ax.set_ylabel("rollout makespan per step, s (median)")
        ax.set_title(f"backend {backend}")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out / "elastic.png", dpi=120)


if __name__ == "__main__":
    main()
