"""`rhymerl bench replicas`: scheduling policies placing a real rollout on N engine replicas.

The simulator (`bench schedule`) prices decode with a cost model; this benchmark runs the same
scheduler objects over real engines (workers/controller/rollout_pool.py, the executor `rhymerl
run` uses with `rollout.replicas` > 1) on a finished run's next epoch, one batch per training
step. Each policy gets a fresh scheduler primed with the run's dumps (the length history a resumed
run would have), and every policy's tokens are checked identical to one engine's.

What is measured: each replica's passes are timed with a real clock while it runs alone (the
replicas share one process and are stepped in turn), a replica's timeline is its passes back to
back, and a step's makespan is the latest timeline end: the rollout time N devices running these
passes would see, not this machine's wall time. `lpt` is given the true lengths (the reference
run's), as an upper reference. With repeats, the policies run interleaved (the order reversed every
other repeat); each step's makespan and each policy's bubble ratio (idle share of replicas x
makespan) are medians over the repeats; migrations and steals are the last repeat's (they vary only
through `realloc`'s clock).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.scheduling.factory import POLICIES, make_scheduler
from rhymerl.api.spec import SchedulingSpec
from rhymerl.errors import OptionError, user_paths
from rhymerl.tools.bench import report
from rhymerl.tools.bench.tables import print_table
from rhymerl.tools.bench.workload import RunWorkload, load_run_workload
from rhymerl.workers.controller.history import RunHistory
from rhymerl.workers.controller.rollout_pool import PoolReport, RolloutPool, table_profile
from rhymerl.workers.controller.speculation import reachable_batches
from rhymerl.workers.history.store import MemoryHistoryStore
from rhymerl.workers.rollout.engine import GenResult, TorchEngine
from rhymerl.workers.rollout.verify_cost import measure


@dataclass
class ReplicaBenchConfig:
    run: Path
    replicas: int = 4
    policies: tuple[str, ...] = ("equal", "lpt", "skew-aware", "realloc", "async", "histopipe")
    groups: int = 4
    repeats: int = 1

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise OptionError(f"--policies: unknown {unknown}; known: {', '.join(POLICIES)}")
        if self.replicas < 2:
            raise OptionError("--replicas: at least 2 (one replica has nothing to schedule)")


def _scheduler_run(w: RunWorkload, engine: TorchEngine, policy: str, cfg: ReplicaBenchConfig,
                   profile: CostProfile, oracle: list[list[int]]) -> tuple[list[GenResult], list[PoolReport]]:
    spec = SchedulingSpec(policy=policy, ranking_groups=cfg.groups)
    history = RunHistory(keep_responses=False, drafting=MemoryHistoryStore())
    history.record(w.records)  # the length history a resumed run replays
    sched = make_scheduler(spec, cfg.replicas, seed=w.job.spec.rollout.seed, max_off_policy=0,
                           profile=table_profile(profile, engine.max_batch_size), history=history.lengths,
                           learns_lengths=False)
    done = max(rec.step for rec in w.records)
    pool = RolloutPool(engine, sched, w.params, first_step=done + 1)
    results: list[GenResult] = []
    reports: list[PoolReport] = []
    for chunk, lengths in zip(w.steps(), oracle, strict=True):
        out, step_report = pool.run(chunk, oracle=lengths)
        results += out
        reports.append(step_report)
        groups: dict[str, list[int]] = {}  # as `rhymerl run` records its history after each step
        for req, res in zip(chunk, out, strict=True):
            groups.setdefault(req.prompt_id, []).append(len(res.response_ids))
        history.lengths.observe_many(groups.items())
    return results, reports


def run_bench(cfg: ReplicaBenchConfig, console: Console) -> dict[str, Any]:
    w = load_run_workload(cfg.run)
    engine = TorchEngine(w.native, w.tokenizer.eos_id, max_batch_size=w.job.spec.rollout.max_batch_size)
    # the scheduler's cost model, as `rhymerl run` gives it: measured passes at the batch sizes it reaches
    profile = measure(w.native, batches=reachable_batches(w.job))
    console.print(f"policy {w.checkpoint}, {len(w.requests)} samples in {len(w.steps())} steps of {w.per_step}, "
                  f"{cfg.replicas} replicas, history from {len(w.records)} dumped responses", highlight=False)
    reference = [r for chunk in w.steps() for r in engine.generate(chunk, w.params)]
    oracle_flat = [len(r.response_ids) for r in reference]
    oracle = [oracle_flat[i: i + w.per_step] for i in range(0, len(oracle_flat), w.per_step)]
    makespans: dict[str, list[list[float]]] = {p: [] for p in cfg.policies}
    bubbles: dict[str, list[float]] = {p: [] for p in cfg.policies}
    last: dict[str, tuple[list[GenResult], list[PoolReport]]] = {}
    for rep in range(cfg.repeats):
        # interleaved, the order reversed every other repeat: drift on a shared machine, and a
        # policy's position in the round, hit every policy alike
        for policy in cfg.policies if rep % 2 == 0 else cfg.policies[::-1]:
            last[policy] = _scheduler_run(w, engine, policy, cfg, profile, oracle)
            reports = last[policy][1]
            makespans[policy].append([r.makespan_s for r in reports])
            bubbles[policy].append(reduce(PoolReport.merged, reports).bubble_ratio)
            console.print(f"    [dim]run {rep + 1}/{cfg.repeats} {policy}: makespan "
                          f"{sum(makespans[policy][-1]):.2f}s, bubble {100 * bubbles[policy][-1]:.1f}%[/]",
                          highlight=False)
    rows: list[dict[str, Any]] = []
    for policy in cfg.policies:
        results, reports = last[policy]
        per_step = [statistics.median(run[i] for run in makespans[policy]) for i in range(len(reports))]
        rows.append({
            "policy": policy,
            "makespan_s": round(sum(per_step), 3),
            "per_step_makespan_s": [round(x, 3) for x in per_step],
            "bubble": round(statistics.median(bubbles[policy]), 4),
            "migrated": sum(r.migrated for r in reports),
            "stolen": sum(r.stolen for r in reports),
            "ranking": sorted({r.ranking for r in reports}),
            "identical": [r.response_ids for r in results] == [r.response_ids for r in reference],
        })
    base = next((r["makespan_s"] for r in rows if r["policy"] == "equal"), rows[0]["makespan_s"])
    for r in rows:
        r["vs_equal"] = round(base / r["makespan_s"], 3) if r["makespan_s"] else None
    return {"replicas": cfg.replicas, "groups": cfg.groups, "repeats": cfg.repeats, "samples": len(w.requests),
            "steps": len(w.steps()), "tokens": sum(oracle_flat), "checkpoint": w.checkpoint, "rows": rows}


def render(result: dict[str, Any], console: Console) -> str:
    cols = ["policy", "makespan_s", "vs_equal", "bubble", "migrated", "stolen", "identical"]
    table = Table(title=f"{result['samples']} samples on {result['replicas']} replicas: rollout makespan "
                        f"(sum of {result['steps']} steps)")
    for c in cols:
        table.add_column(c.replace("_", " "), justify="left" if c == "policy" else "right")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in result["rows"]:
        cells = [f"{100 * r[c]:.1f}%" if c == "bubble" else str(r[c]) for c in cols]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    print_table(console, table)
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    rows = result["rows"]
    steps = len(rows[0]["per_step_makespan_s"])
    fig = Figure(figsize=(9, 4.5))
    ax = fig.subplots()
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        ax.bar([s + i * width for s in range(steps)], r["per_step_makespan_s"], width,
               label=f"{r['policy']} ({r['vs_equal']}x)")
    ax.set_xticks([s + 0.4 - width / 2 for s in range(steps)], [str(s + 1) for s in range(steps)])
    ax.set_xlabel("training step of the replayed epoch")
    ax.set_ylabel("rollout makespan, s (measured pass times)")
    ax.set_title(f"{result['replicas']} engine replicas, {result['samples']} samples")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(cfg: ReplicaBenchConfig, out: Path | None, console: Console) -> None:
    result = run_bench(cfg, console)
    md = render(result, console)
    if out is not None:
        with user_paths("write", out):
            out.mkdir(parents=True, exist_ok=True)
            report.write_json(out / "results.json", result, indent=1)
            report.write_text(out / "table.md", md)
            plot(result, out / "makespan.png")
        console.print(f"results in {out}", markup=False, highlight=False)
