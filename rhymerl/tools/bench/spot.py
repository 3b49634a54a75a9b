"""The price of a step on spot GPUs, simulated: a fixed on-demand fleet, a fixed spot fleet
(preempted GPUs replaced after a delay) and an elastic spot fleet sized before every step by the
fleet-size recommendation (scheduling/fleet_size.py), on each trace, from 16 to 256 GPUs; and,
with `search`, the recommendation against the best fixed size found by simulating every size.

Weak scaling as in `bench scale`: every GPU gets `prompts_per_gpu` GRPO groups per step. The
pipeline is synchronous (rollout of a step waits for the previous step's training), the one in
which the fleet may change between steps (sim/elastic.py). Only rollout GPUs are billed, from
the run's start to its last sample. Prices and preemption inputs: sim/spot.py's docstring.

The search's objective is the recommendation's own rule applied to simulated rollout seconds per
step T(n) (what the recommendation predicts): among the fixed sizes whose parallel efficiency
T(1) / (n T(n)) is at least the recommendation's floor (0.5), the smallest that reaches the
shortest rollout of them all.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rhymerl.algorithms.scheduling import make_scheduler
from rhymerl.api.scheduling import SchedulingSpec
from rhymerl.tools.bench.report import machine, write_results
from rhymerl.tools.bench.tables import print_table
from rhymerl.tools.sim.config import SimConfig
from rhymerl.tools.sim.elastic import ElasticFleet, FleetPlan, run_fleet
from rhymerl.tools.sim.metrics import SimResult
from rhymerl.tools.sim.spot import PreemptionModel, Prices, SpotReport
from rhymerl.tools.traces.model import Trace
from rhymerl.tools.traces.synthetic import PRESETS, load_trace

TRACES = ("synthetic:math", "synthetic:code", "synthetic:dapo-math", "synthetic:vl-video", "synthetic:code-14b",
          "synthetic:search-agent")
EFFICIENCY = 0.5  # the recommendation's default floor (fleet_size.recommend)


@dataclass(frozen=True)
class SpotConfig:
    traces: tuple[str, ...] = TRACES
    gpus: tuple[int, ...] = (16, 64, 256)
    prompts_per_gpu: int = 4
    steps: int = 6
    train_time_s: float = 60.0
    prices: Prices = field(default_factory=Prices)
    model: PreemptionModel = field(default_factory=PreemptionModel)
    policy: str | None = None
    """Scheduling policy (default: SchedulingSpec's)."""
    search: bool = False
    """Evaluate the recommendation against every fixed size 1..gpus (one size in `gpus`)."""


def workload(cfg: SpotConfig, source: str, gpus: int) -> tuple[Trace, int]:
    """The trace at this fleet size and its warm-up steps: a synthetic preset weak-scaled (its
    recurring ids over one epoch of four steps, seeded as history); a CSV as it is, its first epoch
    seeding history as in `bench schedule`."""
    if not source.startswith("synthetic:"):
        trace = load_trace(source)
        return trace, trace.epoch_length()
    pps = cfg.prompts_per_gpu * gpus
    if PRESETS[source.removeprefix("synthetic:")].recurring_ids:
        return load_trace(source, prompts_per_step=pps, num_prompts=pps * 4, steps=4 + cfg.steps), 4
    return load_trace(source, prompts_per_step=pps, steps=cfg.steps), 0


def simulate(cfg: SpotConfig, trace: Trace, warm: int, plan: FleetPlan, model: PreemptionModel | None = None,
             ) -> tuple[SpotReport, SimResult, ElasticFleet]:
    # synchronous for every policy: async's bound is its own max_staleness
    spec = SchedulingSpec(max_staleness=0, **({"policy": cfg.policy} if cfg.policy else {}))
    sched = make_scheduler(spec, plan.gpus, max_off_policy=0, seed=0)
    report, result, fleet = run_fleet(trace, sched, SimConfig(workers=plan.gpus, train_time_s=cfg.train_time_s), plan,
                                 model=model or cfg.model, prices=cfg.prices, warmup_steps=warm, steps=cfg.steps)
    if report.samples_lost != 0:
        raise AssertionError(f"{plan.label} on {trace.name}: {report.samples_lost} samples lost")
    return report, result, fleet


FLEETS: tuple[Callable[[int], FleetPlan], ...] = (
    lambda n: FleetPlan(n, spot=False), lambda n: FleetPlan(n, spot=True), lambda n: FleetPlan(n, spot=True, elastic=True))


def _progress(console: Console | None) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=console, transient=True, disable=console is None)


def run_spot(cfg: SpotConfig, console: Console | None = None) -> list[SpotReport]:
    reports = []
    combos = [(t, n, f) for t in cfg.traces for n in cfg.gpus for f in FLEETS]
    with _progress(console) as progress:
        task = progress.add_task("simulating", total=len(combos))
        for source, n, make in combos:
            plan = make(n)
            progress.update(task, description=f"{source}, {n} GPUs, {plan.label}")
            trace, warm = workload(cfg, source, n)
            reports.append(simulate(cfg, trace, warm, plan)[0])
            progress.advance(task)
    return reports


@dataclass(frozen=True)
class SearchRow:
    trace: str
    max_gpus: int
    rollout_s: dict[int, float]
    """Simulated rollout seconds per step (first admission to last finish, the mean over steps) of
    each fixed on-demand size: what the recommendation predicts and the objective reads."""
    step_s: dict[int, float]
    """Seconds per step, training included, of each fixed size."""
    dollars: dict[int, float]
    """Dollars per step of each fixed size."""
    best: int
    cheapest: int
    """The fixed size with the lowest $ per step."""
    recommended: list[int]
    """The elastic (on-demand) fleet's size at each step."""
    rec_rollout_s: float
    rec_step_s: float
    rec_dollars: float
    reason: str
    """Which rule of the recommendation decided the first step."""


def best_size(rollout_s: dict[int, float], efficiency: float = EFFICIENCY) -> int:
    """The recommendation's rule on simulated times: among sizes n with T(1) / (n T(n)) >= efficiency
    (T(1): the smallest size searched), the smallest reaching the shortest rollout."""
    one = rollout_s[min(rollout_s)]
    useful = [n for n, t in rollout_s.items() if one / (n * t) >= efficiency] or [min(rollout_s)]
    fastest = min(rollout_s[n] for n in useful)
    return min(n for n in useful if rollout_s[n] <= fastest * (1 + 1e-9))


def _rollout_s(result: SimResult) -> float:
    return sum(r.makespan for r in result.steps) / len(result.steps) if result.steps else 0.0


def run_search(cfg: SpotConfig, console: Console | None = None) -> list[SearchRow]:
    (top,) = cfg.gpus
    no_spot = replace(cfg.model, rate_per_gpu_h=0.0)
    rows = []
    with _progress(console) as progress:
        task = progress.add_task("searching", total=len(cfg.traces) * (top + 1))
        for source in cfg.traces:
            trace, warm = workload(cfg, source, top)
            rollout_s, step_s, dollars = {}, {}, {}
            for n in range(1, top + 1):
                progress.update(task, description=f"{source}, fixed {n} GPUs")
                rep, res, _ = simulate(cfg, trace, warm, FleetPlan(n, spot=False), no_spot)
                rollout_s[n], step_s[n], dollars[n] = _rollout_s(res), rep.seconds_per_step, rep.dollars_per_step
                progress.advance(task)
            progress.update(task, description=f"{source}, elastic on-demand")
            rep, res, fleet = simulate(cfg, trace, warm, FleetPlan(top, spot=False, elastic=True), no_spot)
            progress.advance(task)
            rows.append(SearchRow(trace.name, top, rollout_s, step_s, dollars, best_size(rollout_s),
                                  min(dollars, key=lambda n: (dollars[n], n)), fleet.sizes, _rollout_s(res),
                                  rep.seconds_per_step, rep.dollars_per_step, fleet.advice[0].reason))
    return rows


# ---------------------------------------------------------------------- output
COLUMNS = ("trace", "GPUs", "fleet", "s/step", "$/step", "samples/$", "mean GPUs", "preempted", "no notice",
           "tokens recomputed", "samples lost")


def _cells(r: SpotReport) -> list[str]:
    return [r.trace, str(r.max_gpus), r.fleet, f"{r.seconds_per_step:.1f}", f"{r.dollars_per_step:.2f}",
            f"{r.samples_per_dollar:.1f}", f"{r.mean_gpus:.1f}", str(r.preemptions), str(r.missed_notices),
            f"{r.tokens_recomputed:,}", str(r.samples_lost)]


def table(reports: list[SpotReport]) -> Table:
    t = Table(title="a step's seconds and dollars on on-demand, spot and elastic spot fleets (simulated)")
    for col in COLUMNS:
        t.add_column(col, justify="left" if col in ("trace", "fleet") else "right")
    for r in reports:
        t.add_row(*_cells(r))
    return t


def markdown(reports: list[SpotReport]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---" if c in ("trace", "fleet") else "---:" for c in COLUMNS) + "|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in reports]
    return "\n".join(lines) + "\n"


SEARCH_COLUMNS = ("trace", "max GPUs", "best fixed", "rollout s", "s/step", "$/step", "cheapest fixed", "its $/step",
                  "recommended (per step)", "rule", "rec rollout s", "rec s/step", "rec $/step", "rec / best rollout",
                  "rec / best $")


def _search_cells(r: SearchRow) -> list[str]:
    b = r.best
    return [r.trace, str(r.max_gpus), str(b), f"{r.rollout_s[b]:.1f}", f"{r.step_s[b]:.1f}", f"{r.dollars[b]:.2f}",
            str(r.cheapest), f"{r.dollars[r.cheapest]:.2f}", ",".join(map(str, r.recommended)), r.reason,
            f"{r.rec_rollout_s:.1f}", f"{r.rec_step_s:.1f}", f"{r.rec_dollars:.2f}",
            f"{r.rec_rollout_s / r.rollout_s[b]:.2f}", f"{r.rec_dollars / r.dollars[b]:.2f}"]


def search_table(rows: list[SearchRow]) -> Table:
    t = Table(title="the fleet-size recommendation against the best fixed size (simulated, on-demand)")
    for col in SEARCH_COLUMNS:
        t.add_column(col, justify="left" if col in ("trace", "rule", "recommended (per step)") else "right")
    for r in rows:
        t.add_row(*_search_cells(r))
    return t


def search_markdown(rows: list[SearchRow]) -> str:
    lines = ["| " + " | ".join(c.strip() for c in SEARCH_COLUMNS) + " |",
             "|" + "|".join("---" if c in ("trace", "rule", "recommended (per step)") else "---:"
                            for c in SEARCH_COLUMNS) + "|"]
    lines += ["| " + " | ".join(_search_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(reports: list[SpotReport], path: Path) -> None:
    traces = list(dict.fromkeys(r.trace for r in reports))
    fig = Figure(figsize=(3.0 * len(traces), 5.6))
    axes = fig.subplots(2, len(traces), squeeze=False)
    for col, name in enumerate(traces):
        for fleet in dict.fromkeys(r.fleet for r in reports):
            pts = sorted((r.max_gpus, r.seconds_per_step, r.samples_per_dollar) for r in reports
                         if r.trace == name and r.fleet == fleet)
            xs = [p[0] for p in pts]
            axes[0][col].plot(xs, [p[1] for p in pts], marker="o", label=fleet)
            axes[1][col].plot(xs, [p[2] for p in pts], marker="o", label=fleet)
        axes[0][col].set_title(name.removeprefix("synthetic:"), fontsize=9)
        for row in (0, 1):
            axes[row][col].set_xscale("log", base=2)
            axes[row][col].set_yscale("log")
            axes[row][col].grid(alpha=0.3)
            axes[row][col].tick_params(labelsize=7)
        axes[1][col].set_xlabel("GPUs (fleet max)", fontsize=8)
    axes[0][0].set_ylabel("seconds per step", fontsize=8)
    axes[1][0].set_ylabel("samples per $", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def search_plot(rows: list[SearchRow], path: Path) -> None:
    cols = min(4, len(rows))
    grid = -(-len(rows) // cols)
    fig = Figure(figsize=(3.2 * cols, 3.0 * grid))
    axes = list(fig.subplots(grid, cols, squeeze=False).flat)
    for ax in axes[len(rows):]:
        ax.set_visible(False)
    for ax, r in zip(axes, rows, strict=False):
        sizes = sorted(r.rollout_s)
        ax.plot(sizes, [r.rollout_s[n] for n in sizes], marker=".", label="fixed size")
        ax.scatter([r.best], [r.rollout_s[r.best]], s=80, facecolors="none", edgecolors="C2", label="best fixed",
                   zorder=3)
        mean = sum(r.recommended) / len(r.recommended)
        ax.scatter([mean], [r.rec_rollout_s], marker="x", color="C3", s=60, label="recommended (mean size)", zorder=3)
        ax.set_title(r.trace.removeprefix("synthetic:"), fontsize=9)
        ax.set_xlabel("GPUs", fontsize=8)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("rollout seconds per step", fontsize=8)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(cfg: SpotConfig, out: Path | None, console: Console) -> None:
    t0 = time.perf_counter()
    command = "rhymerl " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    inputs: dict[str, Any] = {"command": command, "machine": machine(), "config": asdict(cfg)}
    if cfg.search:
        rows = run_search(cfg, console)
        print_table(console, search_table(rows), keys=1)
        if out is not None:
            data = {**inputs, "objective": f"smallest size reaching the shortest rollout per step among sizes "
                                          f"with parallel efficiency >= {EFFICIENCY}", "rows": [asdict(r) for r in rows]}
            write_results(out, data, search_markdown(rows), lambda p: search_plot(rows, p), "fleet-size.png", console)
    else:
        reports = run_spot(cfg, console)
        print_table(console, table(reports), keys=3)
        if out is not None:
            write_results(out, {**inputs, "runs": [r.row() for r in reports]}, markdown(reports),
                          lambda p: plot(reports, p), "spot.png", console)
    console.print(f"[dim]{time.perf_counter() - t0:.1f} s[/dim]")
