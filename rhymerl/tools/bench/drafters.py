"""`rhymerl bench drafters`: the default scheduler's tail with and without drafters on freed workers
(SPECATOR §4.2, scheduling/freed_drafters.py), simulated on the held-in traces.

Each run replays a trace with the default scheduler (HistoPipe on the shared queue) once without
drafters (the baseline) and once per point of a grid of the two numbers the result hangs on: the
drafts' per-token acceptance and the message latency each drafted pass pays, each without and with
consolidation (a straggling worker emptied onto another so that it drafts). Reported per run, as
means over the steps: rollout seconds per step (first admission to last finish), the tail (the last
10% of a step's samples to finish), the share of the tail with some worker drafting, and the
`rollout_drafting_workers` count. The other costs (draft window, the draft model's profile, a
drafter's batch) are parameters with sources in benchmarks/freed-drafters/README.md.
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rhymerl.algorithms.scheduling import make_scheduler
from rhymerl.algorithms.scheduling.freed_drafters import DraftCosts
from rhymerl.api.scheduling import SchedulingSpec
from rhymerl.tools.bench.report import machine, write_results
from rhymerl.tools.bench.tables import print_table
from rhymerl.tools.sim.config import SimConfig
from rhymerl.tools.sim.engine import Simulator
from rhymerl.tools.traces import load_trace

TRACES = ("synthetic:math", "synthetic:code")
"""The held-in traces of `bench schedule` on the roofline (benchmarks/schedule/results.md)."""


@dataclass(frozen=True)
class DraftersConfig:
    traces: tuple[str, ...] = TRACES
    workers: int = 16
    groups: int = 8
    steps: int = 16
    off_policy: tuple[int, ...] = (1, 0)
    """Off-policy steps of the runs (1: the default pipeline; 0: synchronous, SPECATOR's setting)."""
    acceptance: tuple[float, ...] = (0.3, 0.5, 0.714, 0.9)
    latency_ms: tuple[float, ...] = (0.0, 1.0, 5.0, 20.0)
    window: int = 4
    max_batch: int = 16
    consolidate: tuple[bool, ...] = (False, True)
    """Runs without and with emptying a straggling worker onto another so that it drafts."""


@dataclass(frozen=True)
class Row:
    trace: str
    off_policy: int
    acceptance: float | None
    """None: the baseline, no drafters."""
    latency_ms: float | None
    consolidate: bool
    tokens_per_pass: float
    """Of a drafted sample (1.0 for the baseline)."""
    rollout_s: float
    """Mean over steps of first admission to last finish."""
    tail_s: float
    """Mean over steps of the last 10% of its samples' finishing time."""
    tail_drafting_share: float
    """Mean over steps of the share of the tail with a worker drafting."""
    drafting_workers_peak: float
    """Mean over steps of `rollout_drafting_workers`, the most workers drafting at once in the step."""
    drafting_workers_mean: float
    makespan_s: float
    per_step_drafting_workers: list[int]
    """`rollout_drafting_workers` of every step."""
    consolidations: int
    """Workers emptied onto another so that they draft."""

    @property
    def label(self) -> str:
        if self.acceptance is None:
            return "no drafters"
        return f"p={self.acceptance:g}, {self.latency_ms:g} ms" + (", consolidated" if self.consolidate else "")


def run_one(trace_name: str, cfg: DraftersConfig, off_policy: int, costs: DraftCosts | None) -> Row:
    trace = load_trace(trace_name)
    warm = trace.epoch_length()
    sched = make_scheduler(SchedulingSpec(policy="histopipe", ranking_groups=cfg.groups), cfg.workers, seed=0,
                           max_off_policy=off_policy)
    sim = Simulator(trace, sched, SimConfig(workers=cfg.workers, freed_drafters=costs), warmup_steps=warm,
                    steps=cfg.steps)
    result = sim.run()
    steps = sim.drafting_report()
    n = len(steps)
    return Row(
        trace=trace_name, off_policy=off_policy,
        acceptance=None if costs is None else costs.acceptance,
        latency_ms=None if costs is None else costs.message_s * 1e3,
        consolidate=costs is not None and costs.consolidate,
        tokens_per_pass=1.0 if costs is None else costs.tokens_per_pass,
        rollout_s=sum(s.rollout_s for s in steps) / n, tail_s=sum(s.tail_s for s in steps) / n,
        tail_drafting_share=sum(s.tail_drafting_share for s in steps) / n,
        drafting_workers_peak=sum(s.rollout_drafting_workers for s in steps) / n,
        drafting_workers_mean=sum(s.drafting_workers_mean for s in steps) / n,
        makespan_s=result.makespan, per_step_drafting_workers=[s.rollout_drafting_workers for s in steps],
        consolidations=sim.consolidations,
    )


def run(cfg: DraftersConfig, console: Console | None = None) -> list[Row]:
    grid: list[DraftCosts | None] = [None, *(
        DraftCosts(acceptance=p, window=cfg.window, message_s=ms / 1e3, max_batch=cfg.max_batch, consolidate=c)
        for c in cfg.consolidate for p in cfg.acceptance for ms in cfg.latency_ms)]
    combos = [(t, op, c) for t in cfg.traces for op in cfg.off_policy for c in grid]
    rows = []
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True, disable=console is None) as progress:
        task = progress.add_task("simulating", total=len(combos))
        for t, op, c in combos:
            what = "no drafters" if c is None else f"p={c.acceptance:g}, {c.message_s * 1e3:g} ms" + (
                ", consolidated" if c.consolidate else "")
            progress.update(task, description=f"{t}, off-policy {op}, {what}")
            rows.append(run_one(t, cfg, op, c))
            progress.advance(task)
    return rows


def _base(rows: list[Row], r: Row) -> Row:
    return next(b for b in rows if b.trace == r.trace and b.off_policy == r.off_policy and b.acceptance is None)


def table(rows: list[Row]) -> Table:
    t = Table(title="Drafters on freed workers (means over steps)")
    for col in ("trace", "off-policy", "drafts", "tokens/pass", "rollout s/step", "vs none", "tail s", "tail vs none",
                "tail drafted %", "drafting workers (peak)"):
        t.add_column(col)
    for r in rows:
        b = _base(rows, r)
        t.add_row(r.trace.removeprefix("synthetic:"), str(r.off_policy), r.label, f"{r.tokens_per_pass:.2f}",
                  f"{r.rollout_s:.1f}", f"{b.rollout_s / r.rollout_s:.3f}", f"{r.tail_s:.1f}",
                  f"{b.tail_s / r.tail_s:.3f}", f"{100 * r.tail_drafting_share:.0f}", f"{r.drafting_workers_peak:.1f}")
    return t


def markdown(rows: list[Row]) -> str:
    lines = ["| trace | off-policy | drafts | tokens/pass | rollout s/step | speedup | tail s | tail speedup | "
             "tail drafted % | drafting workers, peak (mean) | consolidations |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = _base(rows, r)
        lines.append(f"| {r.trace.removeprefix('synthetic:')} | {r.off_policy} | {r.label} | {r.tokens_per_pass:.2f} | "
                     f"{r.rollout_s:.1f} | {b.rollout_s / r.rollout_s:.3f} | {r.tail_s:.1f} | {b.tail_s / r.tail_s:.3f} | "
                     f"{100 * r.tail_drafting_share:.0f} | {r.drafting_workers_peak:.1f} ({r.drafting_workers_mean:.2f}) | "
                     f"{r.consolidations} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], cfg: DraftersConfig, path: Path) -> None:
    """Per trace and pipeline: rollout speedup (top) and tail speedup (bottom) over no drafters, by
    acceptance, one colour per message latency; solid with consolidation, dashed without."""
    cases = list(dict.fromkeys((r.trace, r.off_policy) for r in rows))
    fig = Figure(figsize=(3.6 * len(cases), 6.4))
    axes = fig.subplots(2, len(cases), squeeze=False)
    for col, (trace, op) in enumerate(cases):
        base = next(r for r in rows if r.trace == trace and r.off_policy == op and r.acceptance is None)
        for i, ms in enumerate(cfg.latency_ms):
            for merged in cfg.consolidate:
                pts = sorted((r.acceptance, r.rollout_s, r.tail_s) for r in rows if r.trace == trace
                             and r.off_policy == op and r.latency_ms == ms and r.acceptance is not None
                             and r.consolidate == merged)
                xs = [p[0] for p in pts]
                style = {"color": f"C{i}", "marker": "o", "ls": "-" if merged else "--",
                         "label": f"{ms:g} ms" + (", consolidated" if merged else "")}
                axes[0][col].plot(xs, [base.rollout_s / p[1] for p in pts], **style)
                axes[1][col].plot(xs, [base.tail_s / p[2] for p in pts], **style)
        axes[0][col].set_title(f"{trace.removeprefix('synthetic:')}, off-policy {op}", fontsize=9)
        for row in (0, 1):
            axes[row][col].axhline(1.0, color="grey", lw=0.8)
            axes[row][col].grid(alpha=0.3)
            axes[row][col].tick_params(labelsize=7)
        axes[1][col].set_xlabel("draft acceptance p", fontsize=8)
    axes[0][0].set_ylabel("rollout speedup", fontsize=8)
    axes[1][0].set_ylabel("tail speedup", fontsize=8)
    axes[0][0].legend(fontsize=6, title="message latency", title_fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(cfg: DraftersConfig, out: Path | None, console: Console) -> None:
    t0 = time.perf_counter()
    rows = run(cfg, console)
    print_table(console, table(rows), keys=3)
    if out is not None:
        data: dict[str, Any] = {"command": "rhymerl " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                                "machine": machine(), "config": asdict(cfg),
                                "rows": [asdict(r) for r in rows], "seconds": time.perf_counter() - t0}
        write_results(out, data, markdown(rows), lambda p: plot(rows, cfg, p), "drafters.png", console)
    console.print(f"[dim]{time.perf_counter() - t0:.1f} s[/dim]")
