"""`rhymerl bench schedule`: every rollout scheduling policy replayed on one trace, side by side.

Each policy is the production scheduler object (rhymerl.algorithms.scheduling) driven by the
trace-driven simulator (rhymerl.tools.sim). Output: a table (policy x time per step, bubbles,
samples/s, speedup over the equal split, % migrated, gap to the lower bound), one Gantt PNG per
policy, and a JSON with everything. While it runs, the rows simulated so far (over all policies) and
their rate go to stderr; time is linear in the trace's rows (docs/scheduling.md, "Large traces").
"""

from __future__ import annotations

import gc
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from rhymerl.algorithms.scheduling import POLICIES, SpeculationSpeedup, make_scheduler
from rhymerl.algorithms.scheduling.costmodel import IterationProfile, TableProfile
from rhymerl.algorithms.scheduling.histopipe import HistoPipe, Placement
from rhymerl.api.scheduling import MigrationSpec, SchedulingSpec
from rhymerl.errors import OptionError, user_paths
from rhymerl.tools.bench.report import machine, write_json, write_text
from rhymerl.tools.bench.tables import print_table
from rhymerl.tools.sim import SimConfig, SimResult, simulate
from rhymerl.tools.sim.engine import Simulator
from rhymerl.tools.sim.gantt import plot_gantt
from rhymerl.tools.sim.iteration_profile_file import resolve_profile
from rhymerl.tools.traces import Trace, load_trace
from rhymerl.tools.traces.progress import Ticker, reading_bar, rows_bar
from rhymerl.tools.traces.synthetic import parse_overrides


@dataclass(frozen=True)
class Variant:
    key: str
    """File-name slug."""
    spec: SchedulingSpec
    work_stealing: bool = True
    """HistoPipe only: idle workers take waiting samples of their step from busy workers."""
    placement: Placement = "shared"
    """HistoPipe only: the default shared queue, or the paper's per-worker sub-batches."""


def variants(groups: int, first_epoch: str = "prompt-length", max_staleness: int = 1) -> list[Variant]:
    """The rows of the table: the baselines, HistoPipe's per-worker placement (the paper's, the
    default before issue 27) and its ablations, then the default."""
    kw = {"ranking_groups": groups, "first_epoch": first_epoch, "max_staleness": max_staleness}
    return [
        Variant("equal", SchedulingSpec(policy="equal", **kw)),
        Variant("lpt", SchedulingSpec(policy="lpt", **kw)),
        Variant("skew-aware", SchedulingSpec(policy="skew-aware", **kw)),
        Variant("realloc", SchedulingSpec(policy="realloc", **kw)),
        Variant("async", SchedulingSpec(policy="async", **kw)),
        Variant("histopipe-1tier", SchedulingSpec(policy="histopipe", two_tier=False, **kw), placement="per-worker"),
        Variant(
            "histopipe-nosteal", SchedulingSpec(policy="histopipe", **kw), work_stealing=False, placement="per-worker"
        ),
        Variant("histopipe-perworker", SchedulingSpec(policy="histopipe", **kw), placement="per-worker"),
        Variant(
            "histopipe-nomig",
            SchedulingSpec(policy="histopipe", migration=MigrationSpec(enabled=False), **kw),
        ),
        Variant("histopipe", SchedulingSpec(policy="histopipe", **kw)),
    ]


@dataclass(frozen=True)
class BenchConfig:
    trace: str = "synthetic:math"
    workers: int = 16
    groups: int = 8
    steps: int | None = None
    warmup: int | None = None
    profile: str | None = None
    tokens_per_pass: float = 1.0
    pass_cost: float = 1.0
    train_time_s: float = 0.0
    max_off_policy: int = 1
    max_staleness: int = 1
    first_epoch: str = "prompt-length"
    seed: int = 0
    policies: tuple[str, ...] = ()
    synthetic: tuple[str, ...] = ()
    """KEY=VALUE overrides of the synthetic trace's generator (e.g. prompts_per_step=128)."""


@dataclass
class BenchReport:
    config: BenchConfig
    trace: Trace
    warmup: int
    results: list[tuple[Variant, SimResult]]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    rows: int = 0
    """Trace rows each policy's run simulated."""

    @property
    def rows_per_s(self) -> float:
        """Rows simulated over all policies per second of the whole command (reading, simulating, results)."""
        return self.rows * len(self.results) / self.seconds if self.seconds > 0 else 0.0

    @property
    def base(self) -> SimResult:
        return next(r for v, r in self.results if v.key == "equal")


def _warmup(trace: Trace, requested: int | None) -> int:
    if requested is not None:
        return requested
    return trace.epoch_length()


def _extrapolation_note(trace: Trace, profile: IterationProfile) -> list[str]:
    """A measured profile is a grid; say how much of the trace's decoding lies beyond it, where the
    simulator extrapolates (a linear trend of a few noisy cells, not a measurement)."""
    if not isinstance(profile, TableProfile):
        return []
    top = profile.context_lens[-1]
    out = trace.output_len.astype(np.float64)
    beyond = np.clip(trace.input_len + out - np.maximum(top, trace.input_len), 0, out)
    share = float(beyond.sum() / out.sum()) if out.sum() else 0.0
    if share < 0.01:
        return []
    return [f"profile: measured up to context {top}; {100 * share:.0f}% of the trace's decoded tokens lie beyond it "
            f"(up to context {int((trace.input_len + trace.output_len).max())}) and are priced by extrapolation"]


def run_bench(cfg: BenchConfig, console: Console | None = None) -> BenchReport:
    t0 = time.perf_counter()
    with reading_bar(cfg.trace, enabled=console is not None) as on_read:
        trace = load_trace(cfg.trace, progress=on_read, **parse_overrides(list(cfg.synthetic)))
    warmup = _warmup(trace, cfg.warmup)
    if warmup >= trace.num_steps:
        raise OptionError(f"--warmup: {warmup} leaves none of the trace's {trace.num_steps} steps to simulate")
    profile = resolve_profile(cfg.profile)
    spec = SpeculationSpeedup(tokens_per_pass=cfg.tokens_per_pass, pass_cost=cfg.pass_cost)
    sim_cfg = SimConfig(workers=cfg.workers, profile=profile, speculation=spec, train_time_s=cfg.train_time_s)
    chosen = variants(cfg.groups, cfg.first_epoch, cfg.max_staleness)
    if cfg.policies:
        unknown = [p for p in cfg.policies if p not in POLICIES and p not in {v.key for v in chosen}]
        if unknown:
            raise OptionError(f"--policy: unknown {', '.join(unknown)}; choose from {', '.join(v.key for v in chosen)}")
        chosen = [v for v in chosen if v.key == "equal" or v.key in cfg.policies or v.spec.policy in cfg.policies]
    notes = [f"trace {trace.name}: {len(trace)} responses over {trace.num_steps} steps; {trace.id_note()}"]
    notes += [f"trace {trace.name}: {n}" for n in (*trace.notes, trace.turns_note()) if n]
    notes += _extrapolation_note(trace, profile)
    if warmup:
        notes.append(
            f"the first {warmup} step(s) seed history and are not simulated (one epoch: steps before a prompt recurs)"
        )
    with rows_bar("simulating", enabled=console is not None) as tick:
        results = simulate_all(trace, chosen, cfg, sim_cfg, warmup, tick)
    report = BenchReport(config=cfg, trace=trace, warmup=warmup, results=results, notes=notes,
                         rows=simulated_rows(trace, warmup, cfg.steps))
    for v, r in results:
        fallback = sorted({src for src in r.rankings.values() if src in ("prompt-length", "random")})
        if v.spec.policy in ("histopipe", "skew-aware") and fallback:
            share = sum(1 for src in r.rankings.values() if src in fallback) / max(1, len(r.rankings))
            notes.append(
                f"{r.policy}: no history for {100 * share:.0f}% of steps; ranked by {' / '.join(fallback)} there"
                + (" (skew-aware splits equally then)" if v.spec.policy == "skew-aware" else "")
            )
    preempting = [r for _, r in results if r.preemptions]
    if preempting:
        notes.append(
            f"KV cache full ({profile.kv_capacity_tokens:,} tokens per worker): "
            + ", ".join(f"{r.policy} preempted {r.preemptions} sequences" for r in preempting)
            + " (recomputed when readmitted)"
        )
    report.seconds = time.perf_counter() - t0
    return report


def simulated_rows(trace: Trace, warmup: int, steps: int | None) -> int:
    """Rows of the steps one policy's run simulates: those after `warmup`, at most `steps` of them."""
    last = trace.num_steps if steps is None else min(trace.num_steps, warmup + steps)
    return int(np.count_nonzero((trace.step > warmup) & (trace.step <= last)))


def simulate_all(trace: Trace, chosen: list[Variant], cfg: BenchConfig, sim_cfg: SimConfig, warmup: int,
                 tick: Ticker | None = None) -> list[tuple[Variant, SimResult]]:
    """Every chosen policy's run, one after another; `tick` hears the rows done over all of them."""
    each = simulated_rows(trace, warmup, cfg.steps)
    total = each * len(chosen)
    results: list[tuple[Variant, SimResult]] = []
    for i, v in enumerate(chosen):
        sched = make_scheduler(
            v.spec, cfg.workers, profile=sim_cfg.profile, speculation=sim_cfg.speculation,
            max_off_policy=cfg.max_off_policy, seed=cfg.seed, placement=v.placement,
        )
        if isinstance(sched, HistoPipe):
            sched.work_stealing = v.work_stealing
        on_event = None
        if tick is not None:
            tick.describe(f"simulating {v.key} ({i + 1}/{len(chosen)})")
            tick(i * each, total)
            on_event = _reporting(tick, i * each, total)
        with _collector_paused():
            result = simulate(trace, sched, sim_cfg, warmup_steps=warmup, steps=cfg.steps, on_event=on_event)
        results.append((v, result))
    if tick is not None:
        tick(total, total)
    return results


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a policy runs, then a full collection. A run makes
    no cyclic garbage, but every collection walks the millions of objects a large trace's run holds:
    10-20% of the time. The collection afterwards frees the run's simulator (its objects refer to one
    another) before the next policy's is built."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
        gc.collect()


EVENTS_PER_TICK = 2048
"""Simulator events between two progress reports (thousands of rows a second: a few reports a second)."""


def _reporting(tick: Ticker, before: int, total: int) -> Callable[[Simulator], None]:
    """An `on_event` for the simulator: every EVENTS_PER_TICK events, the rows done so far (`before`
    those of the policies already run) out of `total`."""
    events = 0

    def on_event(sim: Simulator) -> None:
        nonlocal events
        events += 1
        if events % EVENTS_PER_TICK == 0:
            tick(before + len(sim.finished), total)

    return on_event


def _ranking(r: SimResult) -> str:
    return "+".join(sorted(set(r.rankings.values()))) or "-"


def rows(report: BenchReport) -> list[dict[str, object]]:
    base = report.base.samples_per_s
    out = []
    for v, r in report.results:
        out.append({
            "policy": r.policy,
            "key": v.key,
            "time_per_step_s": r.time_per_step,
            "bubble_pct": 100 * r.bubble_ratio,
            "samples_per_s": r.samples_per_s,
            "speedup": r.samples_per_s / base if base else 0.0,
            "migrated_pct": 100 * r.migrated_fraction,
            "gap_to_bound_pct": 100 * r.bound_gap,
            "steady_time_per_step_s": r.steady_state()[0],
            "steady_gap_to_bound_pct": 100 * r.steady_gap,
            "mean_batch": r.mean_batch,
            "ranking": _ranking(r),
        })
    return out


HEADERS = (
    "policy", "rollout s/step", "bubble %", "samples/s", "vs equal", "migrated %", "over bound %",
    "steady s/step", "steady over bound %", "mean batch", "ranked by",
)


def _cells(row: dict[str, object]) -> list[str]:
    def f(key: str, fmt: str) -> str:
        return format(row[key], fmt)

    return [
        str(row["policy"]), f("time_per_step_s", ".1f"), f("bubble_pct", ".1f"), f("samples_per_s", ".2f"),
        f"{row['speedup']:.2f}x", f("migrated_pct", ".2f"), f("gap_to_bound_pct", ".1f"),
        f("steady_time_per_step_s", ".1f"), f("steady_gap_to_bound_pct", ".1f"), f("mean_batch", ".1f"),
        str(row["ranking"]),
    ]


def table(report: BenchReport) -> Table:
    lb = report.base.lower_bound
    steps = len(report.base.steps)
    t = Table(
        title=f"rollout scheduling on {report.trace.name}: {report.config.workers} workers, "
        f"{report.config.groups} ranking groups, {steps} steps",
        caption=f"lower bound over the run: max(total work / N = {lb.work_per_worker:.0f} s, longest sample = "
        f"{lb.longest_sample:.0f} s) = {lb.seconds / steps:.1f} s/step; work priced at the cheapest batch <= {lb.batch}; "
        f"steady: first to last step completion vs those steps' work / N "
        f"({report.base.steady_state()[1]:.1f} s/step)",
    )
    for i, h in enumerate(HEADERS):
        t.add_column(h, justify="left" if i in (0, len(HEADERS) - 1) else "right")
    for row in rows(report):
        t.add_row(*_cells(row))
    return t


def markdown(report: BenchReport) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows(report)]
    return "\n".join(lines) + "\n"


def to_json(report: BenchReport, command: str) -> dict[str, object]:
    tr = report.trace
    return {
        "command": command,
        "machine": machine(),
        "seconds": report.seconds,
        "config": asdict(report.config),
        "trace": {
            "name": tr.name, "responses": len(tr), "steps": tr.num_steps, "ids": tr.ids,
            "warmup_steps": report.warmup, "epoch_length": tr.epoch_length(),
        },
        "notes": report.notes,
        "table": rows(report),
        "results": [{"key": v.key, "spec": v.spec.model_dump(mode="json"), **r.summary()} for v, r in report.results],
    }


def write_outputs(report: BenchReport, out: Path, command: str) -> list[Path]:
    with user_paths("write", out):
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for v, r in report.results:
            paths.append(plot_gantt(r, out / f"gantt_{v.key}.png"))
        md = out / "table.md"
        write_text(md, markdown(report))
        js = out / "results.json"
        write_json(js, to_json(report, command))
    return [*paths, md, js]


def main(cfg: BenchConfig, out: Path | None, console: Console) -> None:
    """Run, print the table and notes, write outputs when `out` is given."""
    report = run_bench(cfg, console)
    print_table(console, table(report))
    for note in report.notes:
        console.print(f"[dim]note:[/dim] {note}")
    if out is not None:
        command = "rhymerl " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        written = write_outputs(report, out, command)
        console.print(f"wrote {len(written)} files to {out}/ (results.json, table.md, gantt_*.png)")
    console.print(f"[dim]{report.seconds:.1f} s: {len(report.results)} policies x {report.rows:,} rows, "
                  f"{report.rows_per_s:,.0f} rows/s[/dim]")
