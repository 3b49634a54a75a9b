"""`rhymerl bench profile-recovery`: a verify-cost profile measured 10x too slow, and how fast the
passes it prices correct it.

A profile measured while the machine was busy comes out several times too slow and, cached, used
to steer every later run's draft lengths. This rolls out a finished run's next epoch (its policy,
prompts and history, as `bench rollout` does) in the job's shape, one rollout of
prompts_per_step x group_size samples per training step, through the objects `rhymerl run` uses
(RolloutSpeculation, DraftCapController, ProfileStore opened from a cache entry in a temporary folder), for
six variants side by side:

- clean: a reference profile measured at the start (each cell the fastest of 3 sweeps),
  corrected by the passes as a run corrects it;
- spoiled: every cell of that profile `spoil` times slower (as if measured on a busy machine),
  corrected the same way: cells move as soon as passes land on them (those no pass reaches follow
  the disturbance the others showed), and after each step the cells the passes showed disturbed
  (with most of them disturbed: the whole measurement) are measured again, as a run does between
  steps (timed apart: `remeasure_s`);
- uneven: every cell `spoil` to UNEVEN x `spoil` times slower, drawn per cell, as in the report
  that started this (2 ms cells read 20-110 ms): a uniform factor leaves the costs' ratios, and
  so most cap choices, as they were; an uneven one distorts them; corrected the same way;
- spoiled-as-is, uneven-as-is, clean-as-is: the same profiles taken as given (no per-cell
  correction, no re-measuring), what a run did before the profile corrected itself.

Within a step the six rollouts run interleaved pass by pass (each on its own engine session),
so a slow spell of the shared machine hits every variant alike; each variant's time, and the
pass times its controller sees, are counted only while its own passes run (BusyClock). Each
variant keeps its controller across the steps (a run keeps one) and starts every repeat from its
cache entry as written at the start. Per step: rollout tokens/s, the draft caps chosen, and how
far the variant's profile is from the reference (median over the cells of its cell / the
reference cell). Every variant's tokens are checked identical (sampling is keyed by seed, sample
id and position).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from rhymerl.algorithms.drafting.adaptive_cap import CostEvidence, CostProfile, profile_cells
from rhymerl.errors import OptionError, user_paths
from rhymerl.tools.bench import report
from rhymerl.tools.bench.tables import print_table
from rhymerl.tools.bench.workload import RunWorkload, load_run_workload
from rhymerl.workers.history.store import MemoryHistoryStore
from rhymerl.workers.rollout.engine import EngineSession, TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, GenResult
from rhymerl.workers.rollout.speculation import RolloutSpeculation, reachable_batches
from rhymerl.workers.rollout.speculators import DraftCapController
from rhymerl.workers.rollout.verify_cost import CacheEntry, ProfileStore, measure_cells

VARIANTS = ("clean", "spoiled", "spoiled-as-is", "uneven", "uneven-as-is", "clean-as-is")
UNEVEN = 5.5
"""The uneven spoil: each cell `spoil` to `UNEVEN` x `spoil` times too slow, drawn per cell (seed 0),
as in the report that started this (2 ms cells read 20-110 ms)."""


@dataclass
class RecoveryBenchConfig:
    run: Path
    spoil: float = 10.0
    steps: int | None = None
    repeats: int = 3

    def __post_init__(self) -> None:
        if not self.spoil > 1:
            raise OptionError(f"--spoil: {self.spoil} must be above 1 (a profile measured too slow)")
        if self.repeats < 1:
            raise OptionError("--repeats: at least 1")
        if self.steps is not None and self.steps < 1:
            raise OptionError("--steps: at least 1")


def profile_ratio(profile: CostProfile, reference: CostProfile) -> float:
    """Median over the cells (grid and verify column) of profile / reference."""
    return float(np.median(profile_cells(profile) / profile_cells(reference)))


@dataclass
class StepRun:
    """One variant's rollout of one step in one repeat."""

    variant: str
    repeat: int
    step: int
    seconds: float
    tokens: int
    caps: dict[int, int]
    profile_x: float  # the variant's profile against the clean measurement, after the step
    remeasured: int   # cells measured again after the step
    remeasure_s: float
    tokens_hash: int = field(repr=False, default=0)
    trajectory: list[float] = field(default_factory=list)  # profile_x after each pass (corrected variants)


class BusyClock:
    """A variant's own time: it runs only while one of the variant's passes does. The variants run
    interleaved pass by pass, so a slow spell of the shared machine hits each of them alike, and
    with this clock a variant's pass times (its DraftCapController's evidence) leave the others out."""

    def __init__(self) -> None:
        self.total = 0.0
        self._since: float | None = None

    def __call__(self) -> float:
        return self.total + (time.perf_counter() - self._since if self._since is not None else 0.0)

    def start(self) -> None:
        self._since = time.perf_counter()

    def stop(self) -> None:
        assert self._since is not None
        self.total += time.perf_counter() - self._since
        self._since = None


def _open(w: RunWorkload, variant: str, entry: dict[str, Any], name: str, folder: Path,
          history: MemoryHistoryStore, clock: BusyClock) -> RolloutSpeculation:
    """The speculation state RolloutSpeculation.for_job builds, from `entry` cached in `folder`."""
    with user_paths("write the bench's profile cache", folder):
        (folder / name).write_text(json.dumps(entry))
    costs = ProfileStore.open(w.native, batches=reachable_batches(w.job), folder=folder)
    spec = w.job.spec.rollout.speculation
    if variant.endswith("-as-is"):
        return RolloutSpeculation(spec.method, DraftCapController(spec, costs.profile, clock=clock), history)
    evidence = CostEvidence(costs.profile)
    control = DraftCapController(spec, evidence.profile, evidence=evidence, clock=clock)
    return RolloutSpeculation(spec.method, control, history, costs)


def _measure_clean(w: RunWorkload, folder: Path, sweeps: int, console: Console) -> ProfileStore:
    """The reference profile: every cell the fastest over `sweeps` sweeps of the grid (a slow spell
    spoils a visit of a cell, not the cell)."""
    batches = reachable_batches(w.job)
    console.print(f"measuring the reference verify-cost profile (batches {batches}, {sweeps} sweeps) ...")
    store = ProfileStore.open(w.native, batches=batches, folder=folder)
    e = store.entry
    every = [(i, j) for i in range(len(e.batch_sizes)) for j in range(len(e.tokens) + 1)]
    for _ in range(sweeps - 1):
        timed = measure_cells(w.native, e.context, e.batch_sizes, e.tokens, every)
        e.measured = np.minimum(e.measured, np.array([[timed[(i, j)] for j in range(len(e.tokens) + 1)]
                                                      for i in range(len(e.batch_sizes))]))
    store.write()
    return store


def run_bench(cfg: RecoveryBenchConfig, console: Console) -> tuple[list[StepRun], CostProfile, dict[str, Any]]:
    w = load_run_workload(cfg.run)
    job = w.job
    if job.spec.rollout.speculation.method != "history":
        raise OptionError(f"--run: {cfg.run} ran speculation method '{job.spec.rollout.speculation.method}'; "
                          "this bench replays its history drafts, so it needs a run with method history")
    history = w.history()
    steps = w.steps()[: cfg.steps]
    engine = TorchEngine(w.native, w.tokenizer.stop_ids, job.spec.rollout.max_batch_size)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="rhymerl-profile-recovery-") as tmp:
        root = Path(tmp)
        (root / "measured").mkdir()
        clean_store = _measure_clean(w, root / "measured", 3, console)
        clean = clean_store.profile
        entries = {"clean": clean_store.entry.to_json()}
        spoiled = CacheEntry.from_json(entries["clean"], 0.0)
        spoiled.measured = spoiled.measured * cfg.spoil
        entries["spoiled"] = spoiled.to_json()
        uneven = CacheEntry.from_json(entries["clean"], 0.0)
        factors = np.random.default_rng(0).uniform(cfg.spoil, UNEVEN * cfg.spoil, uneven.measured.shape)
        uneven.measured = uneven.measured * factors
        entries["uneven"] = uneven.to_json()
        console.print(f"policy {w.checkpoint}, history from epoch {w.last_epoch}, {len(steps)} steps of "
                      f"{w.per_step} samples, spoil x{cfg.spoil:g}, torch threads {torch.get_num_threads()}")
        out: list[StepRun] = []
        for rep in range(cfg.repeats):
            clocks = {v: BusyClock() for v in VARIANTS}
            state = {}
            for v in VARIANTS:
                folder = root / f"r{rep}-{v}"
                folder.mkdir()
                state[v] = _open(w, v, entries[v.removesuffix("-as-is")], clean_store.path.name, folder, history,
                                 clocks[v])
            for s, chunk in enumerate(steps):
                order = VARIANTS[(s + rep) % len(VARIANTS):] + VARIANTS[: (s + rep) % len(VARIANTS)]
                out += _step(w, engine, chunk, order, state, clocks, clean, rep, s + 1, console)
                loads.append(os.getloadavg()[0])
    info = report.machine() | {"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                        "load_average_1min": {"min": min(loads), "max": max(loads)}}
    return out, clean, info


def _step(w: RunWorkload, engine: TorchEngine, chunk: list[GenRequest], order: tuple[str, ...],
          state: dict[str, RolloutSpeculation], clocks: dict[str, BusyClock], clean: CostProfile, rep: int, step: int,
          console: Console) -> list[StepRun]:
    """One training step's rollout for every variant, interleaved pass by pass, then what `rhymerl
    run` does after a step (RolloutSpeculation.keep_cost_evidence: cache the evidence, re-measure)."""
    prompt_ids = list(dict.fromkeys(r.prompt_id for r in chunk))
    longest = max(len(r.prompt_ids) for r in chunk)
    sessions: dict[str, EngineSession] = {}
    results: dict[str, dict[int, GenResult]] = {}
    caps_before: dict[str, dict[int, int]] = {}
    busy_before: dict[str, float] = {}
    for v in order:
        sessions[v] = engine.session(w.params, state[v].drafts(w.epoch, prompt_ids), slots=len(chunk),
                                     max_prompt_len=longest)
        for i, r in enumerate(chunk):
            sessions[v].add(i, r)
        results[v] = {}
        caps_before[v] = dict(state[v].control.caps_chosen)
        busy_before[v] = clocks[v].total
    trajectory: dict[str, list[float]] = {v: [] for v in order}
    while any(sess.busy for sess in sessions.values()):
        for v in order:
            if sessions[v].busy:
                clocks[v].start()
                results[v].update(sessions[v].step())
                clocks[v].stop()
                evidence = state[v].control.evidence
                if evidence is not None:
                    trajectory[v].append(profile_ratio(evidence.profile, clean))
    out = []
    for v in order:
        spec = state[v]
        seconds = clocks[v].total - busy_before[v]
        measured_before = len(spec.costs.measured) if spec.costs else 0
        t0 = time.perf_counter()
        spec.keep_cost_evidence()
        remeasure_s = time.perf_counter() - t0
        caps = {k: n - caps_before[v].get(k, 0) for k, n in sorted(spec.control.caps_chosen.items())
                if n > caps_before[v].get(k, 0)}
        profile = spec.control.evidence.profile if spec.control.evidence else spec.control.profile
        assert profile is not None
        responses = tuple(tuple(results[v][i].response_ids) for i in range(len(chunk)))
        run = StepRun(v, rep, step, seconds, sum(len(r) for r in responses), caps,
                      profile_ratio(profile, clean),
                      (len(spec.costs.measured) if spec.costs else 0) - measured_before, remeasure_s,
                      hash(responses), trajectory[v])
        out.append(run)
        console.print(f"    [dim]repeat {rep + 1} step {step} {v}: {seconds:.2f}s {run.tokens / seconds:.0f} tok/s, "
                      f"profile x{run.profile_x:.2f}" + (f", re-measured {run.remeasured} cells in {remeasure_s:.1f}s"
                                                         if run.remeasured else "") + "[/]", highlight=False)
    return out


def passes_until(trajectory: list[float], within: float) -> int | None:
    """Passes after which the profile stays within `within` x of the reference (None: never)."""
    for k in range(len(trajectory)):
        if all(x <= within for x in trajectory[k:]):
            return k + 1
    return None


def summarise(runs: list[StepRun], spoil: float) -> dict[str, Any]:
    """Per step and variant: medians over the repeats, tokens/s also as a ratio to clean in the
    same step and repeat (the same tokens, interleaved pass by pass); per variant over all steps."""
    steps = sorted({r.step for r in runs})
    repeats = sorted({r.repeat for r in runs})
    at = {(r.variant, r.repeat, r.step): r for r in runs}
    rows = []
    for s in steps:
        row: dict[str, Any] = {"step": s}
        for v in VARIANTS:
            mine = [at[(v, k, s)] for k in repeats]
            rates = [r.tokens / r.seconds for r in mine]
            row[v] = {"tokens_per_s": round(statistics.median(rates), 1), "runs": [round(x, 1) for x in rates],
                      "tokens": mine[0].tokens,
                      "vs_clean": round(statistics.median(at[("clean", r.repeat, s)].seconds / r.seconds
                                                          for r in mine), 3),
                      "profile_x": round(statistics.median(r.profile_x for r in mine), 3),
                      "remeasured_cells": max(r.remeasured for r in mine),
                      "remeasure_s": round(max(r.remeasure_s for r in mine), 3),
                      "caps": _merged([r.caps for r in mine])}
        rows.append(row)
    totals = {}
    for v in VARIANTS:
        def rate(k: int, variant: str, first: int) -> float:
            mine = [at[(variant, k, s)] for s in steps if s >= first]
            return sum(r.tokens for r in mine) / sum(r.seconds for r in mine)

        totals[v] = {"tokens_per_s": round(statistics.median(rate(k, v, 1) for k in repeats), 1),
                     "runs": [round(rate(k, v, 1), 1) for k in repeats],
                     "vs_clean": round(statistics.median(rate(k, v, 1) / rate(k, "clean", 1) for k in repeats), 3),
                     "vs_clean_after_step_1": round(statistics.median(rate(k, v, 2) / rate(k, "clean", 2)
                                                                      for k in repeats), 3) if len(steps) > 1 else None}
    recovery: dict[str, dict[str, Any]] = {}
    for v in ("clean", "spoiled", "uneven"):
        first = [at[(v, k, steps[0])].trajectory for k in repeats]
        recovery[v] = {f"passes_until_within_{w}x": [passes_until(t, w) for t in first] for w in (2.0, 1.25)}
        recovery[v]["passes_in_step"] = [len(t) for t in first]
        recovery[v]["profile_x_at_start"] = round(statistics.median(at[(f"{v}-as-is", k, steps[0])].profile_x
                                                                    for k in repeats), 3)
        recovery[v]["profile_x_after_passes"] = {str(n): round(statistics.median(t[min(n, len(t)) - 1] for t in first),
                                                               3) for n in (1, 3, 10, 30, 100) if all(first)}
    reference = {(r.repeat, r.step): r.tokens_hash for r in runs if r.variant == VARIANTS[0]}
    identical = all(reference[(r.repeat, r.step)] == r.tokens_hash for r in runs)
    return {"spoil": spoil, "steps": rows, "totals": totals, "recovery_in_step_1": recovery,
            "identical_tokens": identical}


def _merged(caps: list[dict[int, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in caps:
        for k, n in c.items():
            out[str(k)] = out.get(str(k), 0) + n
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def _markdown(cols: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols),
                      *("| " + " | ".join(r) + " |" for r in rows)]) + "\n"


def render(summary: dict[str, Any], console: Console) -> str:
    """Per step: clean's tokens/s and every other variant's as a ratio to it (medians over the
    repeats of the same-step, same-repeat ratio); then all steps; returns the same as markdown."""
    cols = ["step", "clean tok/s", "spoiled", "prof. x", "as-is", "uneven", "prof. x", "as-is", "clean as-is"]
    rows = [[str(r["step"]), f"{r['clean']['tokens_per_s']:.0f}",
             *(f"{r[v][k]:.2f}" for v, k in (("spoiled", "vs_clean"), ("spoiled", "profile_x"),
                                             ("spoiled-as-is", "vs_clean"), ("uneven", "vs_clean"),
                                             ("uneven", "profile_x"), ("uneven-as-is", "vs_clean"),
                                             ("clean-as-is", "vs_clean")))] for r in summary["steps"]]
    table = Table(title=f"tokens/s vs clean per step; spoiled x{summary['spoil']:g}, uneven "
                        f"x{summary['spoil']:g}-{UNEVEN * summary['spoil']:g}")
    for name in cols:
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(*r)
    print_table(console, table)
    tcols = ["variant", "tok/s", "vs clean", "after step 1", "tok/s per repeat"]
    trows = []
    for v in VARIANTS:
        t = summary["totals"][v]
        after = "-" if t["vs_clean_after_step_1"] is None else f"{t['vs_clean_after_step_1']:.2f}"
        trows.append([v, f"{t['tokens_per_s']:.0f}", f"{t['vs_clean']:.2f}", after,
                      " / ".join(f"{x:.0f}" for x in t["runs"])])
    tot = Table(title="all steps: tokens / seconds (medians over repeats)")
    for name in tcols:
        tot.add_column(name, justify="left" if name in ("variant", "tok/s per repeat") else "right")
    for r in trows:
        tot.add_row(*r)
    print_table(console, tot)
    lines = []
    for v in ("spoiled", "uneven"):
        rec = summary["recovery_in_step_1"][v]
        after = summary["steps"][0][v]["profile_x"]
        lines.append(f"{v} profile, median cell / reference: x{rec['profile_x_at_start']:.1f} at the start; in "
                     "step 1 after " + ", ".join(f"{n} passes x{x:.2f}" for n, x in rec["profile_x_after_passes"].items())
                     + f" (of {statistics.median(rec['passes_in_step']):.0f}); after step 1, its cells re-measured: "
                     f"x{after:.2f}")
        console.print(lines[-1], highlight=False)
    line = "\n\n".join(lines)
    console.print(f"tokens identical in every variant, step and repeat: {summary['identical_tokens']}")
    return (_markdown(cols, rows) + "\n" + _markdown(tcols, trows) + "\n" + line + "\n")


def plot(summary: dict[str, Any], runs: list[StepRun], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.2))
    (ax1, ax2, ax3) = fig.subplots(1, 3)
    steps = [row["step"] for row in summary["steps"]]
    for v in VARIANTS:
        ratios = [row[v]["vs_clean"] for row in summary["steps"]]
        style = "--" if v.endswith("-as-is") else "-"
        ax1.plot(steps, ratios, marker="o", linestyle=style, label=v)
        ax2.plot(steps, [row[v]["profile_x"] for row in summary["steps"]], marker="o", linestyle=style, label=v)
    ax1.axhline(1.0, color="k", lw=0.8)
    ax1.set_xlabel("training step (one rollout of the job's shape)")
    ax1.set_ylabel("rollout tokens/s / clean's (median over repeats)")
    ax2.set_xlabel("training step")
    ax2.set_ylabel("profile / reference after the step (median cell)")
    for r in runs:
        if r.step == steps[0] and r.trajectory:
            ax3.plot(range(1, len(r.trajectory) + 1), r.trajectory, lw=1, alpha=0.7,
                     color={"clean": "C0", "spoiled": "C1", "uneven": "C3"}[r.variant],
                     label=f"{r.variant}" if r.repeat == 0 else None)
    ax3.set_xscale("log")
    ax3.set_xlabel("pass of step 1")
    ax3.set_ylabel("profile / reference (median cell)")
    for ax in (ax2, ax3):
        ax.set_yscale("log")
    for ax in (ax1, ax2, ax3):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"a verify-cost profile measured x{summary['spoil']:g} too slow, corrected by the passes it prices")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(cfg: RecoveryBenchConfig, out: Path | None, console: Console) -> dict[str, Any]:
    runs, clean, info = run_bench(cfg, console)
    summary = summarise(runs, cfg.spoil)
    md = render(summary, console)
    summary |= {"machine": info, "run": str(cfg.run), "repeats": cfg.repeats,
                "clean_profile": {"batch_sizes": clean.batch_sizes, "tokens": clean.tokens, "seconds": clean.seconds,
                                  "verify_one": clean.verify_one},
                "step_runs": [{"variant": r.variant, "repeat": r.repeat, "step": r.step, "seconds": round(r.seconds, 4),
                               "tokens": r.tokens, "caps": r.caps, "profile_x": round(r.profile_x, 4),
                               "remeasured": r.remeasured, "remeasure_s": round(r.remeasure_s, 3),
                               "profile_x_per_pass": [round(x, 3) for x in r.trajectory]} for r in runs]}
    if out is not None:
        report.write_results(out, summary, md, lambda path: plot(summary, runs, path), "recovery.png", console)
    return summary
