"""`rhymerl bench drafter`: what HistoSpec's draft source costs, next to arctic-inference and n-gram.

Why: the paper's claim is that history drafts cost "hundreds of CPU cycles"; a draft source that
takes longer than a decode step's CPU slack, or an index that takes longer to build than an RL step,
would erase the gain. One run measures, side by side on the same histories and sequences:
build throughput, memory per indexed token, serialised size and load time, and the per-sequence
latency of one engine step (report acceptance, feed the new tokens, draft: the rollout engine's own
draft sources' `settle` + `propose`, draft_sources.py) in batches of 1 to 1024.
"""

from __future__ import annotations

import ctypes
import gc
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from rhymerl.algorithms.drafting import HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.errors import user_paths
from rhymerl.tools.bench import report
from rhymerl.tools.bench.draft_replay import replay, replay_units
from rhymerl.tools.bench.draft_sources import (
    ArcticCaches,
    ArcticSource,
    Source,
    arctic_status,
    histospec,
    knob_record,
    ngram,
)
from rhymerl.tools.bench.draft_workloads import PromptWork, dump_workload, synthetic_workload
from rhymerl.tools.bench.tables import print_table
from rhymerl.workers.dumps import DumpError


@dataclass
class DrafterBenchConfig:
    prompts: int = 4
    responses: int = 16
    length: int = 16384
    vocab: int = 32000
    seed: int = 0
    batches: tuple[int, ...] = (1, 64, 256, 1024)
    arctic_depths: tuple[int, ...] = (24, 64)
    iterations: int | None = None  # batched steps timed per batch size; default max(30, 4096 // batch)
    build_repeats: int = 3
    dumps: Path | None = None
    arctic: bool = True
    knobs: SpeculationSpec = field(default_factory=SpeculationSpec.paper_rule)
    tuned: SpeculationSpec = field(default_factory=SpeculationSpec)  # an RLJob's defaults
    quality_units: int = 2  # prompts whose targets are replayed whole for the draft-quality table

    def steps_for(self, batch: int) -> int:
        return self.iterations if self.iterations is not None else max(30, 4096 // batch)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2() -> Any:
    try:
        libc = ctypes.CDLL(None)
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def heap_bytes() -> int:
    """Bytes in use by malloc (glibc mallinfo2: small blocks + mmapped blocks), which is where C++
    containers live; unlike RSS it is not fooled by pages that freed memory leaves mapped.
    Falls back to the resident set size elsewhere."""
    if _MALLINFO2 is not None:
        info = _MALLINFO2()
        return int(info.uordblks + info.hblkhd)
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def measure_build(units: Sequence[PromptWork], repeats: int) -> tuple[list[HistoryIndex], dict[str, Any]]:
    tokens = sum(u.history_tokens for u in units)
    gc.collect()
    before = heap_bytes()
    times = []
    indexes: list[HistoryIndex] = []
    for r in range(repeats):
        t0 = time.perf_counter()
        built = [HistoryIndex.build(u.history) for u in units]
        times.append(time.perf_counter() - t0)
        if r == 0:
            indexes = built
            heap_delta = heap_bytes() - before
    memory = sum(ix.stats().memory_bytes for ix in indexes)
    blobs = [ix.to_bytes() for ix in indexes]
    load_times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for b in blobs:
            HistoryIndex.from_bytes(b)
        load_times.append(time.perf_counter() - t0)
    seconds = float(np.median(times))
    return indexes, {
        "tokens": tokens,
        "build_seconds": seconds,
        "build_tokens_per_s": tokens / seconds,
        "build_ns_per_token": seconds / tokens * 1e9,
        "memory_bytes": memory,
        "bytes_per_token": memory / tokens,
        "heap_bytes_per_token": heap_delta / tokens,
        "states": sum(ix.stats().states for ix in indexes),
        "edges": sum(ix.stats().edges for ix in indexes),
        "serialized_bytes": sum(len(b) for b in blobs),
        "load_seconds": float(np.median(load_times)),
    }


def measure_arctic_build(units: Sequence[PromptWork], depth: int) -> tuple[ArcticCaches, dict[str, Any]]:
    gc.collect()
    before = heap_bytes()
    caches = ArcticCaches.build(units, depth)
    heap_delta = heap_bytes() - before
    return caches, {
        "tokens": caches.tokens,
        "build_seconds": caches.build_seconds,
        "build_tokens_per_s": caches.tokens / caches.build_seconds,
        "build_ns_per_token": caches.build_seconds / caches.tokens * 1e9,
        "heap_bytes_per_token": heap_delta / caches.tokens,
    }


def assign(units: Sequence[PromptWork], batch: int, rng: np.random.Generator) -> tuple[list[int], list[Any], list[Any], list[int]]:
    """Sequences of a batch: round-robin over prompts, targets cycled, random start positions."""
    seq_units, prompts, targets, starts = [], [], [], []
    for i in range(batch):
        u = i % len(units)
        target = units[u].targets[(i // len(units)) % len(units[u].targets)]
        seq_units.append(u)
        prompts.append(units[u].prompt)
        targets.append(target)
        starts.append(int(rng.integers(0, max(1, int(len(target) * 0.9)))))
    return seq_units, prompts, targets, starts


def latency_row(source: Source, units: Sequence[PromptWork], batch: int, steps: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed + batch)
    seq_units, prompts, targets, starts = assign(units, batch, rng)
    stats = replay(source, seq_units, prompts, targets, starts, iterations=steps, rng=rng)
    us = stats.per_sequence_us()
    return {
        "batch": batch,
        "steps": steps,
        "p50_us": _pct(us, 50),
        "p99_us": _pct(us, 99),
        "mean_us": float(us.mean()) if us.size else float("nan"),
        "acceptance_rate": stats.acceptance_rate,
        "accepted_fraction": stats.accepted_fraction,
        "tokens_per_step": stats.tokens_per_step,
    }


def _config_value(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, SpeculationSpec):
        return knob_record(value)
    return value


def run(cfg: DrafterBenchConfig, out: Path, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    with user_paths("write", out):
        out.mkdir(parents=True, exist_ok=True)
    if cfg.dumps is not None:
        units = dump_workload(cfg.dumps)
        if not units:
            raise DumpError(f"{cfg.dumps}: no prompt appears in two consecutive epochs, nothing to replay")
        data = f"rollout dumps {cfg.dumps} ({len(units)} prompt-epoch pairs)"
    else:
        console.log(f"generating synthetic histories: {cfg.prompts} prompts x {cfg.responses} x {cfg.length} tokens")
        units = synthetic_workload(cfg.prompts, cfg.responses, cfg.length, cfg.vocab, cfg.seed)
        data = f"synthetic: {cfg.prompts} prompts x {cfg.responses} responses x {cfg.length} tokens (vocab {cfg.vocab})"
    arctic_ok, arctic_note = arctic_status() if cfg.arctic else (False, "arctic-inference skipped (--no-arctic)")
    results: dict[str, Any] = {
        "data": data,
        "machine": report.machine(),
        "config": {f.name: _config_value(getattr(cfg, f.name)) for f in fields(cfg)},
        "arctic": arctic_note,
        "build": {},
        "latency": {},
    }

    console.log("building HistoSpec indexes")
    indexes, ours = measure_build(units, cfg.build_repeats)
    results["build"]["histospec"] = ours
    caches: dict[int, ArcticCaches] = {}
    if arctic_ok:
        for depth in cfg.arctic_depths:
            console.log(f"building arctic SuffixDecodingCache (max_tree_depth={depth})")
            caches[depth], results["build"][f"arctic-d{depth}"] = measure_arctic_build(units, depth)
    else:
        console.print(f"[yellow]{arctic_note}: comparing HistoSpec with n-gram only[/yellow]")

    for batch in cfg.batches:
        sources: list[Source] = [histospec(indexes, cfg.knobs)]
        sources += [ArcticSource(c, cfg.knobs, name=f"arctic-d{depth}", prefill_tail=depth) for depth, c in caches.items()]
        sources.append(ngram(cfg.knobs))
        for source in sources:
            console.log(f"latency: {source.name}, batch {batch}, {cfg.steps_for(batch)} steps")
            row = latency_row(source, units, batch, cfg.steps_for(batch), cfg.seed)
            results["latency"].setdefault(source.name, []).append(row)
    results["quality"] = draft_quality(cfg, units, indexes, list(caches), console)

    with user_paths("write", out):
        report.write_json(out / "results.json", results, indent=2)
        report.write_text(out / "table.md", markdown(results))
        plot(results, out / "drafter.png")
    print_tables(results, console)
    console.print(f"wrote {out / 'results.json'}, {out / 'table.md'} and {out / 'drafter.png'}")
    return results


def draft_quality(cfg: DrafterBenchConfig, units: Sequence[PromptWork], indexes: Sequence[HistoryIndex],
                  arctic_depths: Sequence[int], console: Console) -> dict[str, Any]:
    """Draft quality: the first `quality_units` prompts' target responses replayed whole (the
    acceptance methodology, see bench acceptance)."""
    sample = list(units[: cfg.quality_units])
    weighted = [HistoryIndex.build(u.history, reward_weighted=True) for u in sample]
    quality: list[Source] = [
        histospec(indexes[: len(sample)], cfg.knobs, name="histospec"),
        histospec(indexes[: len(sample)], cfg.tuned, name="histospec (long match)"),
        histospec(weighted, cfg.tuned, name="histospec (long match, reward-weighted)"),
    ]
    quality += [ArcticSource(ArcticCaches.build(sample, depth), cfg.knobs, name=f"arctic-d{depth}")
                for depth in arctic_depths]
    quality.append(ngram(cfg.knobs))
    responses = sum(len(u.targets) for u in sample)
    out: dict[str, Any] = {"responses": responses, "knobs_tuned": knob_record(cfg.tuned), "sources": {}}
    for source in quality:
        console.log(f"draft quality: {source.name} on {responses} whole responses")
        stats = replay_units(source, sample)
        out["sources"][source.name] = {
            "tokens": stats.generated,
            "accepted_fraction": stats.accepted_fraction,
            "acceptance_rate": stats.acceptance_rate,
            "tokens_per_step": stats.tokens_per_step,
        }
    return out


def tables(results: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table, for the terminal and for markdown."""
    build = results["build"]
    ours = build["histospec"]
    out = []
    header = ["source", "build (M tokens/s)", "ns / token", "ours faster by", "index bytes / token",
              "heap bytes / token", "serialised (MB)", "load (ms)"]
    rows = [["histospec (ours)", f"{ours['build_tokens_per_s'] / 1e6:.2f}", f"{ours['build_ns_per_token']:.0f}", "",
             f"{ours['bytes_per_token']:.1f}", f"{ours['heap_bytes_per_token']:.1f}",
             f"{ours['serialized_bytes'] / 1e6:.1f}", f"{ours['load_seconds'] * 1e3:.1f}"]]
    for name, row in build.items():
        if name != "histospec":
            speed = ours["build_tokens_per_s"] / row["build_tokens_per_s"]
            rows.append([name, f"{row['build_tokens_per_s'] / 1e6:.3f}", f"{row['build_ns_per_token']:.0f}",
                         f"{speed:.0f}x", "n/a", f"{row['heap_bytes_per_token']:.0f}", "n/a (no format)", "n/a"])
    out.append((f"Index build and footprint ({ours['tokens']} history tokens)", header, rows))

    lat = results["latency"]
    batches = [r["batch"] for r in lat["histospec"]]
    header = ["source", *[f"batch {b}" for b in batches]]
    rows = [[name, *[f"{r['p50_us']:.2f} / {r['p99_us']:.2f}" for r in rs]] for name, rs in lat.items()]
    for name, rs in lat.items():
        if name != "histospec":
            rows.append([f"ours faster than {name} (p50)",
                         *[f"{a['p50_us'] / o['p50_us']:.0f}x" for a, o in zip(rs, lat["histospec"], strict=True)]])
    out.append(("Per-sequence latency of one engine step (report + feed + draft), us, p50 / p99", header, rows))

    q = results.get("quality")
    if q:
        header = ["source", "accepted fraction", "acceptance rate", "tokens / verify step"]
        rows = [[name, f"{m['accepted_fraction']:.3f}", f"{m['acceptance_rate']:.3f}", f"{m['tokens_per_step']:.2f}"]
                for name, m in q["sources"].items()]
        tuned = q["knobs_tuned"]
        out.append((f"Draft quality: {q['responses']} whole responses replayed, AIMD window for all; 'long match' = "
                    f"prefix {tuned['prefix_max']}->{tuned['prefix_min']}, min_prob {tuned['min_prob']}", header, rows))
    return out


def print_tables(results: dict[str, Any], console: Console) -> None:
    console.print(f"[bold]{results['data']}[/bold]")
    for title, header, rows in tables(results):
        t = Table(title=title)
        for i, col in enumerate(header):
            t.add_column(col, justify="left" if i == 0 else "right")
        for row in rows:
            t.add_row(*row)
        print_table(console, t)
    console.print(f"[dim]{results['arctic']}; machine: {results['machine']['cpu']}, "
                  f"{results['machine']['logical_cpus']} logical CPUs[/dim]")


def markdown(results: dict[str, Any]) -> str:
    lines = [f"Data: {results['data']}  ", f"Baseline: {results['arctic']}  ",
             f"Machine: {results['machine']['cpu']}, {results['machine']['logical_cpus']} logical CPUs", ""]
    for title, header, rows in tables(results):
        lines += [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines.append("")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5))
    (ax1, ax2) = fig.subplots(1, 2)
    for name, rows in results["latency"].items():
        b = [r["batch"] for r in rows]
        (line,) = ax1.plot(b, [r["p50_us"] for r in rows], marker="o", label=f"{name} p50")
        ax1.plot(b, [r["p99_us"] for r in rows], linestyle="--", alpha=0.5, color=line.get_color(),
                 label=f"{name} p99")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("batch size (sequences)")
    ax1.set_ylabel("per-sequence step latency (us)")
    ax1.set_title("report + feed + draft, per sequence")
    ax1.legend(fontsize=7)
    ax1.grid(True, which="both", alpha=0.3)
    names = list(results["build"].keys())
    speeds = [results["build"][n]["build_tokens_per_s"] for n in names]
    ax2.bar(names, speeds, color=["tab:blue"] + ["tab:orange"] * (len(names) - 1))
    ax2.set_yscale("log")
    ax2.set_ylabel("index build throughput (tokens/s)")
    ax2.set_title("build throughput")
    for i, s in enumerate(speeds):
        ax2.text(i, s, f"{s / 1e6:.2f}M", ha="center", va="bottom", fontsize=8)
    fig.suptitle(results["data"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
