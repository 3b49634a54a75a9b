"""Scale beyond this machine, on paper: the trace-driven simulator with what the distributed
runtime adds at scale, from 16 to 1,024 rollout GPUs.

Weak scaling: every worker gets the same number of samples per step (the trace's prompts per step
grow with the workers), so an ideal system keeps its step time flat. Three costs the runtime
adds, each priced from a measurement or a stated assumption:
- the pipeline: synchronous (rollout of step n+1 waits for step n's training) or off-policy 1
  (it overlaps; the runtime's `max_off_policy_steps: 1`);
- weight sync: the trained weights reach every rollout worker before it may use them
  (`weight_bytes / bandwidth`, one copy per worker in parallel);
- history shipping: each worker waits for the indexes of its prompts, shipped from the moment the
  step is planned (`index_bytes_per_token`, measured here by benchmarks/history-store: 20,604
  bytes for an index of 2,784 response tokens).
Bandwidths: RDMA-class (100 Gb/s, 12.5 GB/s) and what PolyTrace measured for cross-node transfers
through Ray's object serialisation (0.015 GB/s), the path the runtime must not put bulk data on.
The scheduler is HistoPipe with its per-worker placement: the simulator prices index shipping per
worker sub-batch, not for samples pulled from the shared queue of the default placement.
"""

from __future__ import annotations

import math
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
from rhymerl.api.scheduling import SchedulingSpec
from rhymerl.tools.bench.report import machine, write_json, write_text
from rhymerl.tools.bench.tables import print_table
from rhymerl.tools.sim.config import SimConfig
from rhymerl.tools.sim.engine import Simulator
from rhymerl.tools.traces.synthetic import synthetic

INDEX_BYTES_PER_TOKEN = 20_604 / 2_784  # benchmarks/history-store: one prompt's index / its response tokens
BANDWIDTHS = {"rdma-100g": 12.5e9, "ray-serialised": 0.015e9}


@dataclass(frozen=True)
class ScaleConfig:
    trace: str = "synthetic:math"
    workers: tuple[int, ...] = (16, 64, 256, 1024)
    prompts_per_worker: int = 4  # x group size 16 = 64 samples per worker per step
    steps: int = 8
    groups: int = 8
    train_time_s: float = 60.0
    """Seconds of training per step: the trainer's GPUs grow with the rollout's (weak scaling), so constant."""
    weight_bytes: float = 14e9  # a 7B model in bf16
    index_bytes_per_token: float = INDEX_BYTES_PER_TOKEN
    bandwidths: tuple[str, ...] = tuple(BANDWIDTHS)
    free_network: bool = True
    """Also simulate each size without network costs (the reference the priced cells are read against)."""


@dataclass
class Cell:
    workers: int
    pipeline: str
    network: str
    step_s: float
    bubble: float
    weight_sync_s: float
    index_wait_s: float  # per worker per step
    index_mb: float  # shipped per step, all workers


def _cell(cfg: ScaleConfig, workers: int, pipelined: bool, network: str) -> Cell:
    bandwidth = BANDWIDTHS[network] if network != "none" else math.inf
    pps = cfg.prompts_per_worker * workers
    trace = synthetic(cfg.trace, prompts_per_step=pps, num_prompts=pps * 4, steps=4 + cfg.steps)
    sync_s = cfg.weight_bytes / bandwidth if bandwidth < math.inf else 0.0
    sim_cfg = SimConfig(workers=workers, train_time_s=cfg.train_time_s, weight_sync_s=sync_s,
                        index_bytes_per_token=cfg.index_bytes_per_token if bandwidth < math.inf else 0.0,
                        bandwidth_bytes_per_s=bandwidth)
    sched = make_scheduler(SchedulingSpec(policy="histopipe", ranking_groups=cfg.groups), workers,
                           max_off_policy=1 if pipelined else 0, seed=0, placement="per-worker")
    sim = Simulator(trace, sched, sim_cfg, warmup_steps=4, steps=cfg.steps)
    result = sim.run()
    steady, _ = result.steady_state()
    return Cell(workers, "off-policy 1" if pipelined else "synchronous", network, steady, result.bubble_ratio,
                sync_s, sim.ship_wait / workers / cfg.steps, sim.shipped_bytes / cfg.steps / 1e6)


def run_scale(cfg: ScaleConfig, console: Console | None = None) -> list[Cell]:
    networks = (("none",) if cfg.free_network else ()) + cfg.bandwidths
    combos = [(w, p, n) for w in cfg.workers for p in (False, True) for n in networks]
    cells = []
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), console=console, transient=True, disable=console is None)
    with progress:
        task = progress.add_task("simulating", total=len(combos))
        for w, p, n in combos:
            progress.update(task, description=f"{w} workers, {'pipelined' if p else 'synchronous'}, {n}")
            t0 = time.perf_counter()
            cells.append(c := _cell(cfg, w, p, n))
            progress.advance(task)
            if console is not None:
                console.print(f"[dim]{w} GPUs, {c.pipeline}, {n}: {c.step_s:.1f} s/step "
                              f"(simulated in {time.perf_counter() - t0:.0f} s)[/dim]")
    return cells


def table(cells: list[Cell]) -> Table:
    t = Table(title="step time from 16 to 1,024 rollout GPUs (weak scaling, simulated)")
    for col in ("GPUs", "pipeline", "network", "s/step", "bubble", "weight sync s", "index wait s/worker",
                "indexes MB/step"):
        t.add_column(col, justify="right" if col not in ("pipeline", "network") else "left")
    for c in cells:
        t.add_row(str(c.workers), c.pipeline, c.network, f"{c.step_s:.1f}", f"{100 * c.bubble:.1f}%",
                  f"{c.weight_sync_s:.1f}", f"{c.index_wait_s:.2f}", f"{c.index_mb:.1f}")
    return t


def markdown(cells: list[Cell]) -> str:
    lines = ["| GPUs | pipeline | network | s/step | bubble | weight sync s | index wait s/worker | indexes MB/step |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {c.workers} | {c.pipeline} | {c.network} | {c.step_s:.1f} | {100 * c.bubble:.1f}% | "
              f"{c.weight_sync_s:.1f} | {c.index_wait_s:.2f} | {c.index_mb:.1f} |" for c in cells]
    return "\n".join(lines) + "\n"


def plot(cells: list[Cell], path: Path) -> None:
    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for pipeline in ("synchronous", "off-policy 1"):
        for network in sorted({c.network for c in cells}):
            pts = [(c.workers, c.step_s) for c in cells if c.pipeline == pipeline and c.network == network]
            ax.plot(*zip(*pts, strict=True), marker="o", label=f"{pipeline}, {network}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rollout GPUs")
    ax.set_ylabel("seconds per step (steady state)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(cfg: ScaleConfig, out: Path | None, console: Console) -> list[Cell]:
    t0 = time.perf_counter()
    cells = run_scale(cfg, console)
    print_table(console, table(cells), keys=3)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        command = "rhymerl " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        data: dict[str, Any] = {"command": command, "machine": machine(), "config": asdict(cfg),
                                "cells": [asdict(c) for c in cells]}
        write_json(out / "results.json", data)
        write_text(out / "table.md", markdown(cells))
        plot(cells, out / "scale.png")
        console.print(f"wrote results.json, table.md, scale.png to {out}/")
    console.print(f"[dim]{time.perf_counter() - t0:.1f} s[/dim]")
    return cells
