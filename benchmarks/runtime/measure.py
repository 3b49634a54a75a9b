"""The distributed runtime on one machine, measured side by side:

1. step time in-process vs on Ray workers (the runtime's overhead), synchronous vs pipelined
   (`max_off_policy_steps` 0 vs 1): the same job three ways, one after the other, rows of each
   run's metrics.jsonl; tokens compared between in-process and Ray at off-policy 0;
2. history shipping through the runtime: a real redis-server, a HistoryWorker actor on the Redis
   store filled with the in-process run's dumps, and one step's indexes fetched from it by another
   process (through Ray's object store, as a rollout worker receives them): bytes and seconds per
   prompt index, Redis -> history worker -> consumer.

Usage: python benchmarks/runtime/measure.py OUT_DIR [--epochs N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from matplotlib.figure import Figure

from rhymerl.api.load import load_job
from rhymerl.workers import dumps

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "rhymerl"
RUNS = {"in-process": ["backend=local"], "ray sync": ["backend=ray", "algorithm.max_off_policy_steps=0"],
        "ray pipelined": ["backend=ray", "algorithm.max_off_policy_steps=1"]}
REPEATS = 5


def run(out: Path, sets: list[str]) -> float:
    cmd = [str(SCRIPT), "run", str(REPO / "examples" / "quickstart.yaml"), "--out", str(out),
           *(a for s in sets for a in ("--set", s))]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    return time.perf_counter() - t0


def side_by_side(settings: dict[str, list[str]], base: list[str], epochs: int, repeats: int,
                 summary: Callable[[Path, float], dict[str, float]],
                 keep: Callable[[Path], object]) -> tuple[dict[str, list[dict[str, float]]], dict[str, object]]:
    """Each setting's runs of the quickstart (cut to `epochs`), `repeats` times, interleaved (the order
    flips every repeat): every run's `summary(folder, wall seconds)` and, per setting, `keep(folder)`
    of its first run (kept before the run folders go)."""
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in settings}
    kept: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for name in (list(settings) if rep % 2 == 0 else list(settings)[::-1]):
                out = Path(tmp) / f"{name.replace(' ', '-')}-{rep}"
                wall = run(out, [*base, *settings[name], f"algorithm.epochs={epochs}"])
                runs[name].append(summary(out, wall))
                if name not in kept:
                    kept[name] = keep(out)
                print(f"run {rep + 1}/{repeats} {name}: {wall:.1f}s, {runs[name][-1]}", flush=True)
    return runs, kept


def metrics(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def tokens(out: Path) -> list[tuple[int, str, int, tuple[int, ...]]]:
    return [(r.step, r.prompt_id, r.sample_index, tuple(r.response_ids)) for r in dumps.read_run(out)]


def shipping(run_dir: Path) -> dict[str, float]:
    """Redis -> HistoryWorker -> this process, one step's prompts at a time, for the run's last epoch."""
    import ray

    from rhymerl.workers.roles.history_worker import HistoryWorker
    from rhymerl.workers.runtime.cluster import local_ray, spawn

    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed"
    sys.path.insert(0, str(REPO / "tests"))
    from local_servers import free_port

    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        job = load_job(run_dir / "spec.yaml", ["history.store=redis", f"history.redis_url=redis://127.0.0.1:{port}/0"])
        records = dumps.read_run(run_dir)
        last_epoch = max(r.epoch for r in records)
        kept = [r for r in records if r.epoch < last_epoch]
        steps = sorted({r.step for r in records if r.epoch == last_epoch})
        with local_ray("bench"):
            worker = spawn(HistoryWorker, "history", job, lambda: kept)
            ray.get(worker.ping.remote())
            per_prompt_s, per_prompt_bytes = [], []
            for _ in range(REPEATS):
                for step in steps:
                    pids = sorted({r.prompt_id for r in records if r.step == step})
                    t0 = time.perf_counter()
                    found, _ = ray.get(worker.indexes.remote(last_epoch, pids, step))
                    seconds = time.perf_counter() - t0
                    per_prompt_s.append(seconds / len(found))
                    per_prompt_bytes += [len(i.to_bytes()) for i in found.values()]
        return {"prompts_per_fetch": len(pids), "seconds_per_index_median": statistics.median(per_prompt_s),
                "bytes_per_index_median": statistics.median(per_prompt_bytes), "fetches": len(per_prompt_s)}
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = Path(tempfile.mkdtemp(prefix="runtime-bench-"))
    result: dict[str, object] = {"command": " ".join(["python", *sys.argv]), "epochs": args.epochs,
                                 "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                             "python": platform.python_version()}, "runs": {}}
    rows = {}
    for name, sets in RUNS.items():
        folder = runs_dir / name.replace(" ", "-")
        wall = run(folder, [*sets, f"algorithm.epochs={args.epochs}"])
        m = metrics(folder)
        rows[name] = m
        result["runs"][name] = {  # type: ignore[index]
            "wall_s": round(wall, 1), "steps": len(m),
            "step_s_median": statistics.median(float(r["time_step_s"]) for r in m),
            "step_s_median_after_first": statistics.median(float(r["time_step_s"]) for r in m[1:]),
            "rollout_wait_s_median": statistics.median(float(r.get("time_wait_rollout_s") or r["time_rollout_s"])
                                                       for r in m),
            "rollout_s_median": statistics.median(float(r["time_rollout_s"]) for r in m),
            "train_s_median": statistics.median(float(r["time_train_s"]) for r in m),
            "reward_per_epoch": {e: round(statistics.fmean(float(r["reward_mean"]) for r in m if r["epoch"] == e), 4)
                                 for e in sorted({int(r["epoch"]) for r in m})},
        }
    same = tokens(runs_dir / "in-process") == tokens(runs_dir / "ray-sync")
    result["ray_sync_tokens_equal_in_process"] = same
    result["history_shipping"] = shipping(runs_dir / "in-process")
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")

    lines = ["| run | wall s | steps | median s/step | median s/step (after step 1) | controller waits for rollout, median s | rollout s | train s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in result["runs"].items():  # type: ignore[union-attr]
        lines.append(f"| {name} | {r['wall_s']} | {r['steps']} | {r['step_s_median']:.2f} | "
                     f"{r['step_s_median_after_first']:.2f} | {r['rollout_wait_s_median']:.2f} | "
                     f"{r['rollout_s_median']:.2f} | {r['train_s_median']:.2f} |")
    hs = result["history_shipping"]
    lines += ["", f"tokens of ray sync equal to in-process: {same}", "",
              "| history shipping (Redis -> history worker -> consumer) | value |", "|---|---:|",
              f"| bytes per prompt index (median) | {hs['bytes_per_index_median']:,.0f} |",  # type: ignore[index]
              f"| seconds per prompt index (median of {hs['fetches']} fetches of {hs['prompts_per_fetch']}) | "  # type: ignore[index]
              f"{hs['seconds_per_index_median'] * 1e3:.2f} ms |"]  # type: ignore[index]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    for name, m in rows.items():
        ax.plot([r["step"] for r in m], [r["time_step_s"] for r in m], marker=".", label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("seconds per step (controller wall clock)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "step_time.png", dpi=120)


if __name__ == "__main__":
    main()
