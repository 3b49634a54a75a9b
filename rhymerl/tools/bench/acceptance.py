"""`rhymerl bench acceptance`: how much of each epoch the previous epoch's responses could draft.

Why: speculation pays only in proportion to accepted tokens. This replays every response of epoch e
against the index built from the same prompt's epoch e-1 responses (RhymeRL §5.1), through the
rollout engine's own draft sources (draft_sources.py), and through the baselines on the same footing
(same AIMD window policy):
accepted fraction (accepted draft tokens / response tokens: the paper's speculation rate), acceptance
rate (accepted / drafted) and mean tokens per verify step. Also the paper's §5.1 upper bound: a
3-token prefix match with an unlimited draft that follows whichever history branch fits.

Group drafts (Seer): the responses of each prompt's group are replayed together, pass by pass, each
drafting from the siblings' tokens generated so far (a `GroupIndex` grown as they are fed), alone
(every epoch, the first included) and with the history index; and what growing a group index
costs per token. The "long match" rows run with an RLJob's knobs, its index holding the job's
`history_epochs` latest epochs. A prompt's first epoch also replays with the group and the recent responses (the
earlier steps' newest responses to any prompt, within the job's `recent_tokens`), as a job drafts it,
and with the epoch's responses as one pool decoded `batch` at a time, admitted group by group or
sibling by sibling (HistoPipe's `spread_groups`: a group's earlier samples run ahead of its later ones). Fastest-of-N rows: per response, the draft of whichever source (history+group or
group, n-gram) its own emitted tokens confirmed most so far (rhymerl/algorithms/drafting/fastest_of_n.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from rhymerl.algorithms.drafting import GroupIndex, HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.errors import user_paths
from rhymerl.tools.bench import report, tables
from rhymerl.tools.bench.draft_replay import ReplayStats, replay_units
from rhymerl.tools.bench.draft_sources import (
    ArcticCaches,
    ArcticSource,
    Source,
    arctic_status,
    fastest_of_n,
    histospec,
    knob_record,
    ngram,
)
from rhymerl.tools.bench.draft_workloads import PromptWork, dump_workload
from rhymerl.workers.dumps import DumpError
from rhymerl.workers.history.recent import RecentResponses

BOUND = "paper §5.1 bound"
GROUP = "group (long match)"
RECENT_GROUP = "recent+group (long match)"
HISTORY_GROUP = "history+group (long match)"
FASTEST_GROUP = "fastest-of-n (group, n-gram)"
FASTEST_HISTORY_GROUP = "fastest-of-n (history+group, n-gram)"


@dataclass
class AcceptanceConfig:
    dumps: Path
    arctic_depth: int = 64
    arctic: bool = True
    oracle_prefix: int = 3
    lead: int = 128  # group rows "lead": one sibling per group starts this many steps before the rest
    batch: int = 64  # first-epoch rows "batch": at most this many sequences at once (continuous batching)
    knobs: SpeculationSpec = field(default_factory=SpeculationSpec.paper_rule)
    tuned: SpeculationSpec = field(default_factory=SpeculationSpec)  # an RLJob's defaults


def _metrics(stats: ReplayStats) -> dict[str, float | int]:
    return {
        "tokens": stats.generated,
        "accepted": stats.accepted,
        "drafted": stats.drafted,
        "verify_steps": stats.verify_steps,
        "accepted_fraction": stats.accepted_fraction,
        "acceptance_rate": stats.acceptance_rate,
        "tokens_per_step": stats.tokens_per_step,
        "steps": len(stats.step_seconds),  # batched steps until the last response ended (0: an oracle)
    }


def bound_stats(indexes: list[HistoryIndex], units: list[PromptWork], prefix: int) -> ReplayStats:
    stats = ReplayStats(batch=0)
    for index, u in zip(indexes, units, strict=True):
        for t in u.targets:
            acc = index.oracle_accepted(t, prefix)
            stats.generated += len(t)
            stats.accepted += acc
            stats.drafted += acc  # an oracle drafts only what fits
            stats.verify_steps += len(t) - acc
    return stats


def group_update_cost(units: list[PromptWork], depth: int) -> dict[str, float]:
    """Growing one group index per prompt from its responses: time, nodes and bytes per token."""
    groups = [GroupIndex(depth) for _ in units]
    t0, c0 = time.perf_counter(), time.process_time()
    for g, u in zip(groups, units, strict=True):
        for t in u.targets:
            g.extend(t)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(g.n_tokens for g in groups)
    return {"tokens": tokens, "depth": depth, "ns_per_token": seconds / max(tokens, 1) * 1e9,
            "cpu_ns_per_token": cpu / max(tokens, 1) * 1e9,  # this process's CPU time: apart from a busy machine's waits
            "nodes_per_token": sum(g.n_nodes for g in groups) / max(tokens, 1),
            "bytes_per_token": sum(g.memory_bytes for g in groups) / max(tokens, 1)}


def run(cfg: AcceptanceConfig, out: Path, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    units = dump_workload(cfg.dumps, first_epochs=True)
    deep = {(u.prompt_id, u.epoch): u
            for u in dump_workload(cfg.dumps, first_epochs=True, history_epochs=cfg.tuned.history_epochs)}
    if not units:
        raise DumpError(f"{cfg.dumps}: the dumps hold no responses, nothing to replay")
    with user_paths("write", out):
        out.mkdir(parents=True, exist_ok=True)
    arctic_ok, arctic_note = arctic_status() if cfg.arctic else (False, "arctic-inference skipped (--no-arctic)")
    if not arctic_ok:
        console.print(f"[yellow]{arctic_note}: arctic rows left out[/yellow]")
    pairs: dict[tuple[int, bool], list[PromptWork]] = {}
    for u in units:
        pairs.setdefault((u.epoch, bool(u.history)), []).append(u)

    results: dict[str, Any] = {"dumps": str(cfg.dumps), "arctic": arctic_note, "knobs": knob_record(cfg.knobs),
                               "long_match_knobs": knob_record(cfg.tuned), "pairs": [], "all": {},
                               "group_index": []}
    totals: dict[str, ReplayStats] = {}
    recent = recent_indexes(units, cfg.tuned)
    depth = GroupIndex.for_spec(cfg.tuned).depth
    for (epoch, with_history), pair_units in sorted(pairs.items()):
        label = f"{epoch - 1}->{epoch}" if with_history else f"none->{epoch}"
        n_resp = sum(len(u.targets) for u in pair_units)
        console.log(f"epochs {label}: {len(pair_units)} prompts, {n_resp} responses")
        results["group_index"].append({"epochs": label, **group_update_cost(pair_units, depth)})
        row: dict[str, Any] = {"epochs": label, "prompts": len(pair_units), "responses": n_resp, "methods": {}}
        if with_history:
            tuned_idx = [HistoryIndex.build(deep[u.prompt_id, u.epoch].history,
                                            reward_weighted=cfg.tuned.reward_weighted)
                         for u in pair_units]  # the job's: its last `history_epochs` epochs
            methods = history_methods(cfg, pair_units, tuned_idx, arctic_ok)
        else:
            methods = first_epoch_methods(cfg, pair_units, [recent[u.step] for u in pair_units])
        for name, stats in methods:
            row["methods"][name] = _metrics(stats)
            _add(totals, name, stats)
        results["pairs"].append(row)
    results["all"] = {name: _metrics(s) for name, s in totals.items()}

    with user_paths("write", out):
        report.write_json(out / "results.json", results, indent=2)
        plot(results, out / "acceptance.png")
    print_table(results, console)
    console.print(f"wrote {out / 'results.json'} and {out / 'acceptance.png'}")
    return results


def first_epoch_methods(cfg: AcceptanceConfig, units: list[PromptWork],
                        recent: Sequence[HistoryIndex | None]) -> list[tuple[str, ReplayStats]]:
    """A prompt's first epoch, without history: only the group, the recent responses (the earlier
    steps' newest responses to any prompt) and a sequence's own context can draft."""
    none: list[HistoryIndex | None] = [None] * len(units)
    first: list[tuple[Source, int]] = [
        (histospec(none, cfg.tuned, name=GROUP, groups=True), 0),
        (histospec(recent, cfg.tuned, name=RECENT_GROUP, groups=True), 0),
        (histospec(none, cfg.tuned, name=_lead(GROUP, cfg.lead), groups=True), cfg.lead),
        (ngram(cfg.knobs), 0),
        (fastest_of_n([histospec(none, cfg.tuned, name="history", groups=True), ngram(cfg.knobs, name="ngram")],
                      cfg.tuned, name=FASTEST_GROUP), 0),
    ]
    out = [(source.name, replay_units(source, units, lead=lead)) for source, lead in first]
    for name, indexes, spread in ((GROUP, none, False), (GROUP, none, True), (RECENT_GROUP, recent, True)):
        source = histospec(indexes, cfg.tuned, name=_batched(name, cfg.batch, spread), groups=True)
        out.append((source.name, replay_units(source, units, batch=cfg.batch, spread=spread)))
    return out


def history_methods(cfg: AcceptanceConfig, units: list[PromptWork], tuned_idx: Sequence[HistoryIndex],
                    arctic_ok: bool) -> list[tuple[str, ReplayStats]]:
    """An epoch with the previous one's responses: every source, then the paper's §5.1 bound."""
    reward_idx = [HistoryIndex.build(u.history, reward_weighted=True) for u in units]
    freq_idx = [HistoryIndex.build(u.history, reward_weighted=False) for u in units]
    sources: list[Source] = [
        histospec(reward_idx, cfg.knobs, name="histospec (reward)"),
        histospec(freq_idx, cfg.knobs, name="histospec (frequency)"),
        histospec(tuned_idx, cfg.tuned, name="histospec (long match)"),
        histospec([None] * len(units), cfg.tuned, name=GROUP, groups=True),
        histospec(tuned_idx, cfg.tuned, name=HISTORY_GROUP, groups=True),
        histospec(tuned_idx, cfg.tuned, name=_lead(HISTORY_GROUP, cfg.lead), groups=True),
    ]
    if arctic_ok:
        caches = ArcticCaches.build(units, cfg.arctic_depth)
        sources.append(ArcticSource(caches, cfg.knobs, name=f"arctic-d{cfg.arctic_depth}"))
    sources.append(ngram(cfg.knobs))
    sources.append(fastest_of_n([histospec(tuned_idx, cfg.tuned, name="history", groups=True),
                                 ngram(cfg.knobs, name="ngram")], cfg.tuned, name=FASTEST_HISTORY_GROUP))
    out = [(source.name, replay_units(source, units, lead=cfg.lead if source.name.endswith(" ahead") else 0))
           for source in sources]
    out.append((BOUND, bound_stats(reward_idx, units, cfg.oracle_prefix)))
    return out


def recent_indexes(units: list[PromptWork], knobs: SpeculationSpec) -> dict[int, HistoryIndex | None]:
    """Per step, the index of the newest responses of the steps before it, to any prompt, within
    `knobs.recent_tokens` (what a prompt without history drafts from in a job: RecentResponses)."""
    window = RecentResponses(knobs.recent_tokens, knobs.reward_weighted)
    out: dict[int, HistoryIndex | None] = {}
    for step in sorted({u.step for u in units}):
        out[step] = window.index()
        window.add((t, 0.0) for u in units if u.step == step for t in u.targets)
    return out


def _batched(name: str, batch: int, spread: bool) -> str:
    return f"{name}, batch {batch}, {'sibling by sibling' if spread else 'group by group'}"


def _lead(name: str, lead: int) -> str:
    return f"{name}, 1 sibling {lead} steps ahead"


def _add(totals: dict[str, ReplayStats], name: str, stats: ReplayStats) -> None:
    t = totals.setdefault(name, ReplayStats(batch=0))
    t.generated += stats.generated
    t.accepted += stats.accepted
    t.drafted += stats.drafted
    t.verify_steps += stats.verify_steps


def print_table(results: dict[str, Any], console: Console) -> None:
    t = Table(title=f"Drafts from the previous epoch - {results['dumps']}")
    for col in ("epochs", "source", "tokens", "accepted fraction", "acceptance rate", "tokens / verify step", "steps"):
        t.add_column(col, justify="left" if col in ("epochs", "source") else "right")
    rows = [(p["epochs"], p["methods"]) for p in results["pairs"]] + [("all", results["all"])]
    for label, methods in rows:
        for i, (name, m) in enumerate(methods.items()):
            t.add_row(label if i == 0 else "", name, str(m["tokens"]), f"{m['accepted_fraction']:.3f}",
                      f"{m['acceptance_rate']:.3f}" if name != BOUND else "(oracle)", f"{m['tokens_per_step']:.2f}",
                      str(m.get("steps", "")) if label != "all" else "", end_section=i == len(methods) - 1)
    tables.print_table(console, t, keys=2)
    g = Table(title="Group index: growing it token by token")
    for col in ("epochs", "tokens", "wall ns / token", "CPU ns / token", "nodes / token", "bytes / token"):
        g.add_column(col, justify="left" if col == "epochs" else "right")
    for r in results["group_index"]:
        g.add_row(r["epochs"], str(r["tokens"]), f"{r['ns_per_token']:.0f}", f"{r['cpu_ns_per_token']:.0f}",
                  f"{r['nodes_per_token']:.1f}", f"{r['bytes_per_token']:.0f}")
    tables.print_table(console, g, keys=1)
    console.print(f"[dim]{results['arctic']}; knobs {results['knobs']}; long match {results['long_match_knobs']}[/dim]")


def plot(results: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    labels = [p["epochs"] for p in results["pairs"]]
    names = list(results["all"].keys())
    fig = Figure(figsize=(12, 4.5))
    (ax1, ax2) = fig.subplots(1, 2)
    x = np.arange(len(labels))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        frac = [p["methods"].get(name, {}).get("accepted_fraction", np.nan) for p in results["pairs"]]
        steps = [p["methods"].get(name, {}).get("tokens_per_step", np.nan) for p in results["pairs"]]
        ax1.bar(x + i * width, frac, width, label=name)
        ax2.bar(x + i * width, steps, width, label=name)
    for ax, title in ((ax1, "accepted fraction of response tokens"), (ax2, "tokens per verify step")):
        ax.set_xticks(x + width * (len(names) - 1) / 2, labels)
        ax.set_xlabel("epoch pair (history -> replayed)")
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
    ax1.set_ylim(0, 1)
    ax1.legend(fontsize=7)
    fig.suptitle(f"Drafting epoch e from epoch e-1: {results['dumps']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
