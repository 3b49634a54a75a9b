"""`rhymerl bench rollout`: speculative vs plain rollout, same prompts and weights, side by side.

Takes a finished run folder: the policy of its newest checkpoint, its prompts, and the history
index of each prompt built from the run's last epoch. Every method generates the next epoch of
that run (same sample keys, the run's prompt order) for each workload, and every method's tokens
are checked identical to plain decoding's. With `--epoch N` it generates the run's epoch N instead,
each step drafting from what the run's history worker held before that step (epoch 1: no prompt's
own history, only the group's and the recent responses), so epoch 1 is measured as a job drafts it.
Workloads: `job`, the run's own rollout (one engine call per training step of prompts_per_step x
group_size samples, so each step ends in its long tail, as in `rhymerl run`), and integer batch
sizes (all samples as one pool, continuously batched). With repeats, the methods run interleaved
(the order reversed every other repeat) and the median is reported. Methods:

- none: plain decoding (the reference)
- ngram: drafts from the sequence's own context (vLLM's prompt-lookup)
- history: HistoSpec as the job runs it (its `speculation` block: by default branches ranked by
  frequency, with group drafts)
- history-alone: the same without group drafts (the prompt's earlier epochs, or the recent
  responses, only)
- history-weighted: the same index ranked by summed reward (RhymeRL's weighting)
- history-paper: the same index drafted by the paper's rule (prefix 7 -> 3, no min_prob), to
  show what the job's defaults (prefix 32 -> 1, min_prob 0.5) add
- history-mismatched: each prompt drafts from another prompt's history — poor drafts, to show the
  adaptive cap switching speculation off where it would slow things down
- history-mismatched-fixed: the same poor drafts with the cap pinned at window.max (no adaptation)
- draft-model: a small model's greedy drafts (the job's speculation.draft_model, else the embedded
  policy's distilled draft), under the same AIMD windows and adaptive cap; left out of the default
  methods where the run's policy has no known draft
- fastest-of-n: history (as the job runs it) and n-gram, plus the draft model where the job names
  one, chosen per response by what its own tokens confirmed (rollout/fastest_of_n.py); the split
  of the drafting passes by source is reported
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.errors import UserError, user_paths
from rhymerl.tools.bench import report
from rhymerl.tools.bench.tables import print_table
from rhymerl.tools.bench.workload import EpochDrafting, RunWorkload, load_run_workload
from rhymerl.workers.model.folder import model_dir
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.reward.pool import Scorer, open_scorer
from rhymerl.workers.rollout.draft_model import DraftModelDrafts, default_draft, load_draft_model
from rhymerl.workers.rollout.engine import DraftSource, TorchEngine
from rhymerl.workers.rollout.fastest_of_n import job_sources
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams, merged_counts
from rhymerl.workers.rollout.speculation import speculation_metrics
from rhymerl.workers.rollout.speculators import DraftCapController, HistoryDrafts, NgramDrafts
from rhymerl.workers.rollout.verify_cost import measure

METHODS = ("none", "ngram", "history", "history-alone", "history-weighted", "history-paper", "history-mismatched",
           "history-mismatched-fixed", "draft-model", "fastest-of-n")


JOB = "job"
"""The workload shaped as the run's own rollout: one generate() per training step."""


@dataclass
class RolloutBenchConfig:
    run: Path
    batch_sizes: tuple[int | str, ...] = (JOB, 16, 64, 256)
    methods: tuple[str, ...] = METHODS
    repeats: int = 1
    device: str = "cpu"
    epoch: int | None = None
    """The run's epoch to generate (None: one past its last)."""


@dataclass
class Row:
    method: str
    batch: int | str
    seconds: float
    tokens: int
    passes: int
    drafted: int
    accepted: int
    identical: bool
    caps: dict[int, int] = field(default_factory=dict)
    runs: list[float] = field(default_factory=list)  # every repeat's seconds, in run order
    sources: dict[str, Any] | None = None  # per draft source: share of the drafting passes, acceptance

    def as_dict(self, base_seconds: float) -> dict[str, Any]:
        return {"method": self.method, "batch": self.batch, "seconds": round(self.seconds, 3),
                "tokens": self.tokens, "tokens_per_s": round(self.tokens / self.seconds, 1),
                "speedup": round(base_seconds / self.seconds, 3),
                "tokens_per_pass": round(self.tokens / max(self.passes, 1), 3),
                "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else None,
                "spec_rate": round(self.accepted / max(self.tokens, 1), 4),
                "identical": self.identical, "caps": self.caps, "runs": [round(t, 3) for t in self.runs],
                "sources": self.sources}


def method_spec(method: str, job_spec: SpeculationSpec) -> SpeculationSpec:
    """The speculation block a method runs with: the job's, with what the method changes."""
    spec = job_spec.model_copy(deep=True)
    if method.endswith("-fixed"):
        spec.disable_above_batch = 10**9
    if method == "history-paper":
        spec.prefix.max, spec.prefix.min, spec.min_prob = 7, 3, 0.0
    if method == "history-alone":
        spec.group_drafts = False
    return spec


def _sources(method: str, spec: SpeculationSpec, drafting: dict[bool, dict[str, HistoryIndex]],
             control: DraftCapController, draft: TinyLlama | None = None) -> DraftSource | None:
    """The draft source a method decodes one engine call with; `drafting`: each prompt's history index
    for that call, by reward weighting."""
    if method == "none":
        return None
    if method == "ngram":
        return NgramDrafts(spec, control)
    if method == "draft-model":
        if draft is None:
            raise ValueError("draft-model: no draft model")
        return DraftModelDrafts(spec, draft, control)
    indexes = drafting[_weighting(method, spec)]
    if method.startswith("history-mismatched"):
        ids = list(indexes)
        indexes = {pid: indexes[other] for pid, other in zip(ids, ids[1:] + ids[:1], strict=True)}
    if method == "fastest-of-n":
        return job_sources(spec, indexes, control, draft if spec.draft_model is not None else None)
    return HistoryDrafts(spec, indexes, control)


NO_HISTORY = ("none", "ngram", "draft-model")
"""The methods that draft from no history index (every other one reads one)."""


def _weighting(method: str, spec: SpeculationSpec) -> bool:
    """Whether the history a method drafts from is reward-weighted."""
    return spec.reward_weighted or method == "history-weighted"


@dataclass
class _Drafting:
    """Indexes of each weighting the methods read, per engine call of a workload: as the epoch began
    (a pool of the whole epoch), or step by step as the epoch is generated (the job's steps)."""

    at_start: dict[bool, dict[str, HistoryIndex]] = field(default_factory=dict)
    steps: dict[bool, EpochDrafting] | None = None

    def before(self, call: int) -> dict[bool, dict[str, HistoryIndex]]:
        if self.steps is None:
            return self.at_start
        return {v: d.before(call) for v, d in self.steps.items()}

    def generated(self, call: int, results: list[GenResult]) -> None:
        for d in (self.steps or {}).values():
            d.generated(call, results)


def _timed(engine: TorchEngine, chunks: list[list[GenRequest]], params: SamplingParams, drafting: _Drafting,
           source: Callable[[dict[bool, dict[str, HistoryIndex]]], DraftSource | None]) -> tuple[list[GenResult], float]:
    """The workload's engine calls in order, each with the source made from its indexes; seconds in
    the calls (the history's work between them, as in a job, is not the rollout's)."""
    results: list[GenResult] = []
    seconds = 0.0
    for i, chunk in enumerate(chunks):
        indexes = drafting.before(i)
        t0 = time.perf_counter()
        done = engine.generate(chunk, params, source(indexes))
        seconds += time.perf_counter() - t0
        drafting.generated(i, done)
        results += done
    return results, seconds


def _draft_model(cfg: RolloutBenchConfig, w: RunWorkload, model: TinyLlama, console: Console
                 ) -> tuple[RolloutBenchConfig, TinyLlama | None]:
    """The draft model the methods need (the job's, else the policy's known draft), and `cfg`
    without `draft-model` where the default methods ask for one the policy lacks."""
    job = w.job
    name = job.spec.rollout.speculation.draft_model or default_draft(job.spec.model.path)
    if name is None and "draft-model" in cfg.methods:
        if cfg.methods != METHODS:
            raise UserError(f"--methods draft-model: {job.spec.model.path} has no embedded draft model; name one in "
                            "the run's spec.rollout.speculation.draft_model")
        console.print(f"[dim]draft-model left out: {job.spec.model.path} has no known draft model[/]")
        cfg = replace(cfg, methods=tuple(m for m in cfg.methods if m != "draft-model"))
    if name is not None and {"draft-model", "fastest-of-n"} & set(cfg.methods):
        return cfg, load_draft_model(name, model_dir(job.spec.model.path), next(model.parameters()).dtype, cfg.device)
    return cfg, None


def _measure_profile(model: TinyLlama, sizes: list[int]) -> CostProfile:
    """The verify-cost profile, measured afresh (not the start-up cache) so the committed profile is
    this run's machine state, up to the largest batch a workload runs at."""
    grid = {b for b in (1, 4, 16, 64, 128, 256) if b < max(sizes)} | set(sizes)
    return measure(model, batches=tuple(sorted(grid)))


def _describe(cfg: RolloutBenchConfig, w: RunWorkload) -> str:
    """The bench's first line: the policy, the epoch and what it drafts from, the samples, the device."""
    where = torch.cuda.get_device_name(cfg.device) if cfg.device.startswith("cuda") else \
        f"torch threads {torch.get_num_threads()}"
    drafted_from = f"history of epochs {max(1, w.epoch - w.job.spec.rollout.speculation.history_epochs)}-{w.last_epoch}" \
        if w.epoch > 1 else "no history of its own (group and recent responses)"
    return f"policy {w.checkpoint}, epoch {w.epoch} drafting from {drafted_from}, {len(w.requests)} samples, {where}"


def _workload(cfg: RolloutBenchConfig, w: RunWorkload, model: TinyLlama, batch: int | str, scorer: Scorer,
              weightings: set[bool], at_start: dict[bool, dict[str, HistoryIndex]]
              ) -> tuple[TorchEngine, list[list[GenRequest]], _Drafting]:
    """The engine, engine calls and drafting of one workload."""
    tok, max_batch = w.tokenizer, w.job.spec.rollout.max_batch_size
    if batch == JOB:  # the job's rollout: each step's prompts x group_size, decoded together
        engine = TorchEngine(model, tok.stop_ids, max_batch_size=max_batch, device=cfg.device)
        return engine, w.steps(), _Drafting(steps={v: w.drafting(scorer, reward_weighted=v) for v in weightings})
    # one pool of all samples, continuously batched at `batch`, drafting as the epoch began
    engine = TorchEngine(model, tok.stop_ids, max_batch_size=int(batch), device=cfg.device)
    return engine, [w.requests], _Drafting(at_start)


_Runs = dict[str, tuple[list[GenResult], dict[int, int]]]
"""Each method's last repeat: its results and the draft caps it chose (cap: passes)."""


def _run_methods(cfg: RolloutBenchConfig, w: RunWorkload, batch: int | str, engine: TorchEngine,
                 chunks: list[list[GenRequest]], drafting: _Drafting, profile: CostProfile, draft: TinyLlama | None,
                 console: Console) -> tuple[dict[str, list[float]], _Runs]:
    """Every method's repeats on one workload: each repeat's seconds, and its last repeat's runs."""
    times: dict[str, list[float]] = {m: [] for m in cfg.methods}
    last: _Runs = {}
    for rep in range(cfg.repeats):
        # interleaved, the order reversed every other repeat: drift on a shared machine, and
        # a method's position in the round, hit every method alike
        for method in cfg.methods if rep % 2 == 0 else cfg.methods[::-1]:
            spec = method_spec(method, w.job.spec.rollout.speculation)
            control = DraftCapController(spec, None if method.endswith("-fixed") else profile)
            results, seconds = _timed(engine, chunks, w.params, drafting,
                                      partial(_sources, method, spec, control=control, draft=draft))
            times[method].append(seconds)
            console.print(f"    [dim]run {rep + 1}/{cfg.repeats} batch {batch} {method}: "
                          f"{times[method][-1]:.2f}s[/]", highlight=False)
            last[method] = (results, dict(sorted(control.caps_chosen.items())))
    return times, last


def _rows(methods: tuple[str, ...], batch: int | str, times: dict[str, list[float]], last: _Runs) -> list[Row]:
    """Each method's row on one workload; `identical` against the first method's tokens."""
    reference = last[methods[0]][0]
    rows = []
    for method in methods:
        results, caps = last[method]
        row = Row(method, batch, statistics.median(times[method]), sum(len(r.response_ids) for r in results),
                  sum(r.forward_passes for r in results), sum(r.drafted for r in results),
                  sum(r.accepted for r in results),
                  [r.response_ids for r in results] == [r.response_ids for r in reference], caps,
                  times[method])
        row.sources = speculation_metrics(row.tokens, row.drafted, row.accepted, row.passes,
                                          merged_counts(r.by_source for r in results)).get("spec_sources")
        rows.append(row)
    return rows


def run_bench(cfg: RolloutBenchConfig, console: Console) -> tuple[list[dict[str, Any]], CostProfile]:
    w = load_run_workload(cfg.run, cfg.epoch)
    job = w.job
    model = w.native.to(cfg.device)
    cfg, draft = _draft_model(cfg, w, model, console)
    # only the weightings the chosen methods draft from: each one's history is built and fed every step
    weightings = {_weighting(m, method_spec(m, job.spec.rollout.speculation)) for m in cfg.methods
                  if m not in NO_HISTORY}
    pools = [b for b in cfg.batch_sizes if b != JOB]  # they draft from the epoch's start, built once for all
    at_start = {v: w.drafting_at_start(reward_weighted=v) for v in weightings} if pools else {}
    sizes = [b if isinstance(b, int) else min(w.per_step, job.spec.rollout.max_batch_size) for b in cfg.batch_sizes]
    profile = _measure_profile(model, sizes)
    console.print(_describe(cfg, w))
    out: list[dict[str, Any]] = []
    with open_scorer(job.spec.reward) as scorer:  # rewards the epoch's own steps, as the job's history has them
        for batch in cfg.batch_sizes:
            engine, chunks, drafting = _workload(cfg, w, model, batch, scorer, weightings, at_start)
            times, last = _run_methods(cfg, w, batch, engine, chunks, drafting, profile, draft, console)
            base = 0.0
            for row in _rows(cfg.methods, batch, times, last):
                base = base or row.seconds
                out.append({"epoch": w.epoch, **row.as_dict(base)})
                console.print(f"  batch {batch!s:>4} {row.method:<26} {row.seconds:7.2f}s  x{base / row.seconds:5.2f}  "
                              f"identical={row.identical}", highlight=False)
    return out, profile


def render(rows: list[dict[str, Any]], console: Console) -> str:
    table = Table(title="speculative rollout vs plain (same prompts, weights, sample keys)")
    cols = ["batch", "method", "seconds", "tokens_per_s", "speedup", "tokens_per_pass", "acceptance", "spec_rate",
            "identical"]
    for c in cols:
        table.add_column(c.replace("_", " "), justify="right" if c not in ("method",) else "left")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = ["-" if r[c] is None else str(r[c]) for c in cols]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    print_table(console, table, keys=2)
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    methods = list(dict.fromkeys(r["method"] for r in rows))
    batches = list(dict.fromkeys(r["batch"] for r in rows))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        vals = [next(r["speedup"] for r in rows if r["method"] == m and r["batch"] == b) for b in batches]
        ax.bar([j + i * width for j in range(len(batches))], vals, width, label=m)
    ax.axhline(1.0, color="k", lw=0.8)
    labels = [f"batch {b}" if b != JOB else "job steps" for b in batches]
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(batches))], labels)
    ax.set_ylabel("rollout speedup vs none")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_profile(profile: CostProfile, path: Path) -> None:
    """The verify-cost profile: seconds per pass, and the per-token cost of a pass, by batch size."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    (ax1, ax2) = fig.subplots(1, 2)
    for i, (b, row) in enumerate(zip(profile.batch_sizes, profile.seconds, strict=True)):
        line, = ax1.plot(profile.tokens, [1e3 * t for t in row], marker="o", label=f"batch {b}")
        if profile.verify_one is not None:  # the verify path with no draft token: where drafting starts from
            ax1.plot([1], [1e3 * profile.verify_one[i]], marker="x", color=line.get_color(), linestyle="none")
        ax2.plot(profile.tokens, [1e6 * t / (b * n) for t, n in zip(row, profile.tokens, strict=True)],
                 marker="o", label=f"batch {b}")
    ax1.set_xlabel("tokens appended per sequence (1 + draft length)")
    ax1.set_ylabel("ms per forward pass (x: verify pass, 1 token per sequence)")
    ax2.set_xlabel("tokens appended per sequence (1 + draft length)")
    ax2.set_ylabel("µs per appended token")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("verify-cost profile t(batch, tokens) of the rollout model on this machine")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def profile_table(profile: CostProfile) -> str:
    """ms per forward pass by batch and tokens per sequence, with the verify pass of one token where the
    profile has it (the torch engine's; vLLM runs no separate verify path)."""
    verify = profile.verify_one
    head = "| batch \\ tokens/seq | " + " | ".join(str(t) for t in profile.tokens) + \
        (" | verify, 1 token |" if verify is not None else " |")
    lines = [head, "|" + "---|" * (len(profile.tokens) + 1 + (verify is not None))]
    for i, (b, row) in enumerate(zip(profile.batch_sizes, profile.seconds, strict=True)):
        cells = (*row, verify[i]) if verify is not None else row
        lines.append(f"| {b} | " + " | ".join(f"{1e3 * t:.2f}" for t in cells) + " |")
    note = (" (the last column: a verify pass whose sequences carry no draft token, the cost a pass starts from "
            "once any sequence drafts)") if verify is not None else ""
    return f"ms per forward pass{note}\n\n" + "\n".join(lines) + "\n"


def main(cfg: RolloutBenchConfig, out: Path | None, console: Console) -> None:
    rows, profile = run_bench(cfg, console)
    md = render(rows, console)
    if out is not None:
        with user_paths("write", out):
            out.mkdir(parents=True, exist_ok=True)
            report.write_json(out / "results.json", rows, indent=1)
            report.write_text(out / "table.md", md + "\n" + profile_table(profile))
            plot(rows, out / "speedup.png")
            plot_profile(profile, out / "verify_profile.png")
        console.print(f"results in {out}", markup=False, highlight=False)
