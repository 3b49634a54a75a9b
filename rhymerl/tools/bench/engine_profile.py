"""`rhymerl bench engine-profile`: the torch engine's decode iteration time over batch size x
context, written as an iteration profile for the scheduling simulator (`bench schedule --profile`).

The simulator's default cost model is a roofline of an H100 serving a 7B model: a model output,
not a measurement. This measures the engine we run on the machine at hand, with the engine's own
forward pass (`TinyLlama.forward_cached`, one token per sequence) and prefill, so the simulator can
replay traces with real numbers. Output: profile.json (docs/formats.md, "Iteration profile"),
table.md and profile.png.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rhymerl.api.inputs import ModelSpec
from rhymerl.errors import OptionError, user_paths
from rhymerl.tools.bench import report
from rhymerl.tools.bench.tables import print_table
from rhymerl.tools.sim.iteration_profile_file import FORMAT, ProfileFile, ProfilePoint, save_profile
from rhymerl.workers.model.registry import load_native_policy
from rhymerl.workers.rollout.verify_cost import measure_decode_grid, measure_prefill


@dataclass(frozen=True)
class EngineProfileConfig:
    model: str = "builtin:tiny-arith"
    dtype: str = "float32"
    device: str = "cpu"
    batch_sizes: tuple[int, ...] = (1, 4, 16, 64, 128, 256)
    contexts: tuple[int, ...] = (64, 256, 512, 1000)
    prefill_tokens: int = 512
    rounds: int = 10


def _check(cfg: EngineProfileConfig, max_positions: int) -> None:
    for name, axis in (("--batch-sizes", cfg.batch_sizes), ("--contexts", cfg.contexts)):
        if len(axis) < 2:
            raise OptionError(f"{name}: need at least 2 values, got {list(axis)}")
        if list(axis) != sorted(set(axis)):
            raise OptionError(f"{name}: values must be strictly increasing, got {list(axis)}")
    if cfg.batch_sizes[0] < 1:
        raise OptionError(f"--batch-sizes: {cfg.batch_sizes[0]} must be >= 1")
    if cfg.contexts[0] < 1:
        raise OptionError(f"--contexts: {cfg.contexts[0]} must be >= 1")
    # the cache holds context + the decoded token, at positions the model has rotary tables for
    if cfg.contexts[-1] >= max_positions:
        raise OptionError(f"--contexts: {cfg.contexts[-1]} is beyond the model's {max_positions} positions "
                         f"(largest usable: {max_positions - 1})")
    if not 1 <= cfg.prefill_tokens <= max_positions:
        raise OptionError(f"--prefill-tokens: {cfg.prefill_tokens} must be within 1..{max_positions}")


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    info = report.machine()
    return f"{info['cpu'] or 'CPU'} ({info['logical_cpus']} logical CPUs, {torch.get_num_threads()} torch threads)"


def measure_profile(cfg: EngineProfileConfig, console: Console | None = None) -> ProfileFile:
    model, _ = load_native_policy(ModelSpec.model_validate({"path": cfg.model, "dtype": cfg.dtype}), cfg.device)
    model.eval()
    _check(cfg, model.cfg.max_position_embeddings)
    cells = len(cfg.batch_sizes) * len(cfg.contexts) * cfg.rounds
    with Progress(TextColumn("measuring decode passes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=console is None) as bar:
        task = bar.add_task("grid", total=cells)
        grid = measure_decode_grid(model, cfg.batch_sizes, cfg.contexts, cfg.rounds,
                                   progress=lambda: bar.advance(task))
    prefill = measure_prefill(model, cfg.prefill_tokens, 2 * cfg.rounds)
    points = [ProfilePoint(batch_size=b, context_len=c, seconds=grid[i][j])
              for i, b in enumerate(cfg.batch_sizes) for j, c in enumerate(cfg.contexts)]
    return ProfileFile(
        format=FORMAT, engine="torch", model=cfg.model, device=device_name(cfg.device), dtype=cfg.dtype,
        notes=(f"rhymerl bench engine-profile: one plain decode pass (one token per sequence) per cell, the fastest "
               f"of {cfg.rounds} sweeps over the grid (2 timings per visit, after a warm-up), made monotone in batch "
               f"and context; prefill per token from one "
               f"{cfg.prefill_tokens}-token prompt. The simulator extrapolates linearly beyond the grid "
               f"(contexts above {cfg.contexts[-1]}, batches above {cfg.batch_sizes[-1]})."),
        max_batch=cfg.batch_sizes[-1], prefill_seconds_per_token=prefill, points=points)


def _grid_ms(doc: ProfileFile) -> tuple[list[int], list[int], dict[tuple[int, int], float]]:
    """Batch sizes, context lengths and milliseconds per (batch, context) of a profile."""
    ms = {(p.batch_size, p.context_len): p.seconds * 1e3 for p in doc.points}
    return sorted({b for b, _ in ms}), sorted({c for _, c in ms}), ms


def markdown(doc: ProfileFile) -> str:
    batches, contexts, ms = _grid_ms(doc)
    lines = ["| batch \\ context | " + " | ".join(str(c) for c in contexts) + " |",
             "|---|" + "---|" * len(contexts)]
    lines += [f"| {b} | " + " | ".join(f"{ms[(b, c)]:.2f}" for c in contexts) + " |" for b in batches]
    return "\n".join(lines) + "\n"


def table(doc: ProfileFile) -> Table:
    batches, contexts, ms = _grid_ms(doc)
    out = Table(title=f"ms per decode iteration: {doc.engine} engine, {doc.model}, {doc.dtype}, {doc.device}")
    out.add_column("batch", justify="right")
    for c in contexts:
        out.add_column(f"ctx {c}", justify="right")
    for b in batches:
        out.add_row(str(b), *(f"{ms[(b, c)]:.2f}" for c in contexts))
    return out


def plot(doc: ProfileFile, path: Path) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4))
    (left, right) = fig.subplots(1, 2)
    for c in sorted({p.context_len for p in doc.points}):
        pts = sorted((p.batch_size, p.seconds) for p in doc.points if p.context_len == c)
        left.plot([b for b, _ in pts], [s * 1e3 for _, s in pts], marker="o", label=f"context {c}")
        right.plot([b for b, _ in pts], [b / s for b, s in pts], marker="o", label=f"context {c}")
    left.set(xscale="log", xlabel="batch (sequences)", ylabel="ms per decode iteration")
    right.set(xscale="log", xlabel="batch (sequences)", ylabel="tokens / s")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{doc.engine} engine on {doc.device}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(cfg: EngineProfileConfig, out: Path, console: Console) -> ProfileFile:
    t0 = time.perf_counter()
    doc = measure_profile(cfg, console)
    print_table(console, table(doc))
    console.print(f"prefill: {doc.prefill_seconds_per_token * 1e6:.1f} us per token")
    command = shlex.join(["rhymerl", "bench", "engine-profile", "--out", str(out), "--model", cfg.model, "--dtype",
                          cfg.dtype, "--device", cfg.device, "--batch-sizes", ",".join(map(str, cfg.batch_sizes)),
                          "--contexts", ",".join(map(str, cfg.contexts)), "--prefill-tokens",
                          str(cfg.prefill_tokens), "--rounds", str(cfg.rounds)])
    with user_paths("write", out):
        save_profile(out / "profile.json", doc)
        report.write_text(out / "table.md", f"```\n{command}\n```\n\n{markdown(doc)}")
        plot(doc, out / "profile.png")
        report.write_json(out / "machine.json", report.machine())
    console.print(f"wrote {out}/profile.json (use: rhymerl bench schedule --profile {out}/profile.json), "
                  f"table.md, profile.png [dim]{time.perf_counter() - t0:.1f} s[/dim]")
    return doc
