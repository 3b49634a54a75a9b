"""`rhymerl bench contention`: the torch engine's rollout beside busy processes, at fixed and adaptive threads.

The workload is a job's first epoch as `rhymerl run` rolls it out (the job's prompt order, its
sample keys, one engine call of prompts_per_step x group_size samples per training step, no
history yet so no drafts), cut to `steps` training steps. It runs with 0, 1, 2 ... competing
processes that spin on the CPU (`python -c 'while True: pass'`), at 1 thread, at the machine's
count (every CPU this process may run on) and adaptive (spec.rollout.adaptive_threads: a
ThreadChooser starting from the machine's count). Within a contention level the thread settings
run interleaved, the order reversed every other repeat; medians are reported.

The fair share of a contended machine is what one thread gets, which the 1-thread run measures
under the same contention: `vs_fair` is each setting's median over the 1-thread median of its
level. `identical` says whether a setting's tokens equal the machine count's tokens with no
contention (they do: MKL runs in strict reproducibility mode, rhymerl/__init__.py).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from rhymerl.algorithms.thread_choice import ThreadChooser
from rhymerl.api.load import load_job
from rhymerl.api.spec import RLJobSpec
from rhymerl.errors import user_paths
from rhymerl.tools.bench import report
from rhymerl.tools.bench.tables import print_table
from rhymerl.workers.model.registry import load_native_policy
from rhymerl.workers.model.tokenizer import Tokenizer
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, SamplingParams
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.task.prompts import epoch_order, load_prompts, prompt_tokens

BUSY = "while True: pass"


@dataclass
class ContentionBenchConfig:
    job: Path
    steps: int = 1
    busy: tuple[int, ...] = (0, 1, 2)
    repeats: int = 3


def settings(machine: int) -> tuple[str, ...]:
    """The thread settings compared: 1 thread, the machine's count, adaptive from it."""
    return ("1", str(machine), "adaptive") if machine > 1 else ("1", "adaptive")


@contextmanager
def busy_processes(n: int) -> Iterator[list[int]]:
    """`n` processes spinning on the CPU while inside; their pids."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0.0)  # let the scheduler spread them
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def _first_epoch(spec: RLJobSpec, tok: Tokenizer, steps: int) -> list[list[GenRequest]]:
    """The job's first epoch as `rhymerl run` rolls it out, one engine call per training step, cut to
    `steps` training steps."""
    prompts = load_prompts(spec.data)
    order = [prompts[i] for i in epoch_order(len(prompts), spec.data.seed, 0, spec.data.shuffle)]
    per_step = spec.algorithm.prompts_per_step
    return [[GenRequest(prompt_tokens(tok, p), sample_key(p.prompt_id, 0, g), p.prompt_id)
             for p in order[s * per_step:(s + 1) * per_step] for g in range(spec.algorithm.group_size)]
            for s in range(min(steps, len(order) // per_step))]


def _level_rows(level: int, runs: dict[str, list[float]], same: dict[str, bool] | None,
                chosen: dict[str, dict[int, int]]) -> list[dict[str, Any]]:
    """One contention level's rows, a setting each (in `runs`' order); `same`: whether each setting's
    tokens were the reference's (None: no reference)."""
    fair = statistics.median(runs["1"])
    rows = []
    for name, seconds in runs.items():
        median = statistics.median(seconds)
        rows.append({"busy": level, "threads": name, "seconds": round(median, 3),
                     "vs_fair": round(median / fair, 3), "runs": [round(t, 3) for t in seconds],
                     "identical": same[name] if same is not None else None,
                     "passes_at": {str(n): k for n, k in sorted(chosen.get(name, {}).items())}})
    return rows


def run_bench(cfg: ContentionBenchConfig, console: Console) -> dict[str, Any]:
    with user_paths("read the job", cfg.job):
        job = load_job(cfg.job)
    spec = job.spec
    model, tok = load_native_policy(spec.model)
    steps = _first_epoch(spec, tok, cfg.steps)
    params = SamplingParams(spec.rollout.temperature, spec.rollout.top_p, spec.rollout.seed,
                            spec.algorithm.max_response_length)
    machine = len(os.sched_getaffinity(0))
    names = settings(machine)
    was = torch.get_num_threads()
    load_before = os.getloadavg()

    def rollout(setting: str) -> tuple[float, list[list[int]], ThreadChooser | None]:
        chooser = ThreadChooser(machine) if setting == "adaptive" else None
        torch.set_num_threads(machine if chooser else int(setting))
        engine = TorchEngine(model, tok.stop_ids, spec.rollout.max_batch_size, threads=chooser)
        t0 = time.perf_counter()
        tokens = [r.response_ids for batch in steps for r in engine.generate(batch, params)]
        return time.perf_counter() - t0, tokens, chooser

    console.print(f"{sum(map(len, steps))} samples in {len(steps)} steps of {cfg.job}, {machine} CPUs, "
                  f"settings {', '.join(names)}, load average {load_before[0]:.2f}", highlight=False)
    rows: list[dict[str, Any]] = []
    reference: list[list[int]] | None = None
    try:
        rollout("1")  # warm-up: allocator, kernels
        for level in cfg.busy:
            runs: dict[str, list[float]] = {n: [] for n in names}
            same: dict[str, bool] = dict.fromkeys(names, True)
            chosen: dict[str, dict[int, int]] = {}
            with busy_processes(level):
                for rep in range(cfg.repeats):
                    for name in names if rep % 2 == 0 else names[::-1]:
                        seconds, tokens, chooser = rollout(name)
                        if reference is None and name == str(machine) and level == 0:
                            reference = tokens
                        same[name] &= reference is None or tokens == reference
                        runs[name].append(seconds)
                        if chooser is not None:
                            for n, k in chooser.passes_at.items():
                                chosen.setdefault(name, {})[n] = chosen.get(name, {}).get(n, 0) + k
                        console.print(f"    [dim]{level} busy, run {rep + 1}/{cfg.repeats}, threads {name}: "
                                      f"{seconds:.2f}s[/]", highlight=False)
            rows += _level_rows(level, runs, same if reference is not None else None, chosen)
    finally:
        torch.set_num_threads(was)
    return {"job": str(cfg.job), "samples": sum(map(len, steps)), "steps": len(steps), "repeats": cfg.repeats,
            "machine_cpus": machine, "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "info": report.machine() | {"torch": torch.__version__}, "rows": rows}


COLUMNS = ("busy", "threads", "seconds", "vs_fair", "runs", "identical", "passes_at")


def render(result: dict[str, Any], console: Console) -> str:
    table = Table(title=f"rollout seconds, {result['samples']} samples ({result['steps']} steps), medians of "
                        f"{result['repeats']}; vs fair = over 1 thread under the same contention")
    for c in COLUMNS:
        table.add_column(c.replace("_", " "), justify="left" if c in ("threads", "runs", "passes_at") else "right")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in result["rows"]:
        cells = [", ".join(map(str, r[c])) if c == "runs" else
                 " ".join(f"{n}:{k}" for n, k in r[c].items()) if c == "passes_at" else str(r[c]) for c in COLUMNS]
        table.add_row(*cells, end_section=r["threads"] == "adaptive")
        lines.append("| " + " | ".join(cells) + " |")
    print_table(console, table, keys=2)
    load = f"load average before {result['load_before']}, after {result['load_after']}"
    console.print(load, highlight=False)
    return "\n".join(lines) + f"\n\n{load}\n"


def plot(result: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    rows = result["rows"]
    levels = sorted({r["busy"] for r in rows})
    names = list(dict.fromkeys(r["threads"] for r in rows))
    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ys = [next(r["seconds"] for r in rows if r["busy"] == b and r["threads"] == name) for b in levels]
        ax.bar([x + i * width for x in range(len(levels))], ys, width, label=f"threads {name}")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(levels))], [f"{b} busy" for b in levels])
    ax.set_yscale("log")
    ax.set_ylabel("rollout seconds (median, log scale)")
    ax.set_title(f"{result['samples']} samples on {result['machine_cpus']} CPUs beside busy processes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(cfg: ContentionBenchConfig, out: Path | None, console: Console) -> None:
    result = run_bench(cfg, console)
    md = render(result, console)
    if out is not None:
        report.write_results(out, result, md, lambda path: plot(result, path), "contention.png", console)
