"""`rhymerl bench replicas`: scheduling policies placing a real rollout on N rollout workers.

The simulator (`bench schedule`) prices decode with a cost model; this benchmark runs the rollout
fleet `rhymerl run` runs (workers/controller/fleet.py: the scheduler objects, the one executor, N
rollout workers in this process) on a finished run's next epoch, one round per training step. Each
policy gets a fresh fleet whose scheduler is primed with the run's dumps (the length history a
resumed run would have), and every policy's tokens are checked identical to one engine's.

What is measured: the workers share one process and are stepped in turn, each worker's passes timed
with a real clock while it runs alone; a worker's timeline is its passes back to back, and a step's
makespan is the latest timeline end: the rollout time N devices running these passes would see, not
this machine's wall time. `lpt` is given the true lengths (the reference run's), as an upper
reference. With repeats, the policies run interleaved (the order reversed every other repeat); each
step's makespan and each policy's bubble ratio (idle share of workers x makespan) are medians over
the repeats; moves are the last repeat's (they vary only through `realloc`'s clock).

Group drafts across workers: with `--relay both` each policy also runs with the relay of
siblings' tokens between workers off (`speculation.group_relay`), so each worker's group indexes
hold only the siblings it runs; `--first-epoch` replays the epoch as a run's first one sees it (no
history index, no length history), where the group is the only draft source. Tokens per pass
(response tokens over each response's verify passes) is reported per variant.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rhymerl.algorithms.scheduling.factory import POLICIES
from rhymerl.algorithms.scheduling.history import LengthHistory
from rhymerl.api.scheduling import SchedulingSpec
from rhymerl.errors import OptionError
from rhymerl.tools.bench import report
from rhymerl.tools.bench.tables import print_table
from rhymerl.tools.bench.workload import RunWorkload, load_run_workload
from rhymerl.workers.controller.fleet import RolloutFleet, Round
from rhymerl.workers.controller.history_client import HistoryClient
from rhymerl.workers.controller.loop import fleet_metrics
from rhymerl.workers.controller.transport import LocalTransport
from rhymerl.workers.roles.history_worker import HistoryWorker
from rhymerl.workers.roles.reward_worker import RewardWorker
from rhymerl.workers.roles.rollout_worker import RolloutWorker
from rhymerl.workers.roles.samples import SampleRef, ScoredSample
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.speculation import speculation_metrics
from rhymerl.workers.task.prompts import encode_prompts, load_prompts


@dataclass
class ReplicaBenchConfig:
    run: Path
    replicas: int = 4
    policies: tuple[str, ...] = ("equal", "lpt", "skew-aware", "realloc", "async", "histopipe")
    groups: int = 4
    repeats: int = 1
    relay: tuple[bool, ...] = (True,)
    """Group drafts across workers: the variants run (True: siblings' tokens relayed between workers)."""
    first_epoch: bool = False
    """Replay as a first epoch: no history index and no length history."""

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise OptionError(f"--policies: unknown {unknown}; known: {', '.join(POLICIES)}")
        if self.replicas < 2:
            raise OptionError("--replicas: at least 2 (one worker has nothing to schedule)")


def _variants(cfg: ReplicaBenchConfig) -> list[tuple[str, bool]]:
    return [(p, relay) for p in cfg.policies for relay in cfg.relay]


def _label(policy: str, relay: bool, cfg: ReplicaBenchConfig) -> str:
    return policy if len(cfg.relay) == 1 else f"{policy}, relay {'on' if relay else 'off'}"


def _fleet_run(w: RunWorkload, policy: str, relay: bool, cfg: ReplicaBenchConfig,
               oracle: dict[SampleRef, int]) -> tuple[dict[SampleRef, list[int]], list[Round]]:
    """The epoch on a fresh fleet of `cfg.replicas` workers placed by `policy` (`relay`: siblings'
    tokens relayed between workers): every response's tokens, and one round per training step."""
    job = w.job.model_copy(deep=True)
    job.spec.rollout.replicas = job.spec.rollout.max_replicas = cfg.replicas
    job.spec.rollout.min_replicas = 1
    job.spec.scheduling = SchedulingSpec(policy=policy, ranking_groups=cfg.groups)
    job.spec.algorithm.max_off_policy_steps = 0
    job.spec.rollout.speculation.group_relay = relay
    t = LocalTransport()
    notes: list[str] = []
    reward = [t.start("reward", RewardWorker, job)]
    records = [] if cfg.first_epoch else w.records
    history = HistoryClient(t, lambda: t.start("history", HistoryWorker, job), lambda: records, notes.append)
    lengths = LengthHistory()  # the length history a resumed run replays from its dumps
    groups: dict[tuple[int, str], list[int]] = {}
    for rec in records:
        groups.setdefault((rec.step, rec.prompt_id), []).append(len(rec.response_ids))
    for (_, pid), ls in groups.items():
        lengths.observe(pid, ls)
    encoded = encode_prompts(w.tokenizer, load_prompts(job.spec.data))
    done = max(rec.step for rec in w.records)
    fleet = RolloutFleet(job, t, lengths, encoded, reward, lambda: t.start("rollout", RolloutWorker, job),
                         lambda: cfg.replicas, notes.append, notes.append)
    tokens: dict[SampleRef, list[int]] = {}
    rounds = []
    try:
        fleet.start(1, dict(w.model.hf_state_dict()), history, rounds_before=done)
        g = job.spec.algorithm.group_size
        for i, chunk in enumerate(w.steps()):
            prompts = [r.prompt_id for r in chunk[::g]]
            rnd = fleet.launch([(w.epoch, p) for p in prompts], done + i + 1, inter_step=False, oracle=oracle)
            s: ScoredSample
            for _, scored in fleet.collect(rnd):
                for s in t.get(scored):
                    tokens[s.sample] = s.result.response_ids
            for p in prompts:  # as `rhymerl run` learns lengths when a group completes
                lengths.observe(p, [len(tokens[SampleRef(p, k, w.epoch)]) for k in range(g)])
            rounds.append(rnd)
    finally:
        fleet.close()
        if history.handle is not None:
            t.stop(history.handle)
        for r in reward:
            t.stop(r)
    return tokens, rounds


def run_bench(cfg: ReplicaBenchConfig, console: Console) -> dict[str, Any]:
    w = load_run_workload(cfg.run)
    engine = TorchEngine(w.native, w.tokenizer.stop_ids, max_batch_size=w.job.spec.rollout.max_batch_size)
    console.print(f"policy {w.checkpoint}, {len(w.requests)} samples in {len(w.steps())} steps of {w.per_step}, "
                  f"{cfg.replicas} workers, history from {len(w.records)} dumped responses", highlight=False)
    g = w.job.spec.algorithm.group_size
    reference = {SampleRef(req.prompt_id, i % g, w.epoch): res.response_ids for chunk in w.steps()
                 for i, (req, res) in enumerate(zip(chunk, engine.generate(chunk, w.params), strict=True))}
    oracle = {s: len(ids) for s, ids in reference.items()}
    variants = _variants(cfg)
    makespans: dict[tuple[str, bool], list[list[float]]] = {v: [] for v in variants}
    bubbles: dict[tuple[str, bool], list[float]] = {v: [] for v in variants}
    last: dict[tuple[str, bool], tuple[dict[SampleRef, list[int]], list[Round]]] = {}
    for rep in range(cfg.repeats):
        # interleaved, the order reversed every other repeat: drift on a shared machine, and a
        # policy's position in the round, hit every policy alike
        for v in variants if rep % 2 == 0 else variants[::-1]:
            last[v] = _fleet_run(w, *v, cfg, oracle)
            rounds = last[v][1]
            makespans[v].append([fleet_metrics([r], cfg.replicas, cfg.replicas)["rollout_makespan_s"] for r in rounds])
            bubbles[v].append(fleet_metrics(rounds, cfg.replicas, cfg.replicas)["rollout_bubble"])
            console.print(f"    [dim]run {rep + 1}/{cfg.repeats} {_label(*v, cfg)}: makespan "
                          f"{sum(makespans[v][-1]):.2f}s, bubble {100 * bubbles[v][-1]:.1f}%, "
                          f"{tokens_per_pass(rounds):.2f} tokens per pass[/]", highlight=False)
    rows: list[dict[str, Any]] = []
    for v in variants:
        tokens, rounds = last[v]
        per_step = [statistics.median(run[i] for run in makespans[v]) for i in range(len(rounds))]
        metrics = fleet_metrics(rounds, cfg.replicas, cfg.replicas)
        rows.append({
            "policy": _label(*v, cfg),
            "scheduler": v[0],
            "relay": v[1],
            "makespan_s": round(sum(per_step), 3),
            "tokens_per_pass": round(tokens_per_pass(rounds), 3),
            "per_step_makespan_s": [round(x, 3) for x in per_step],
            "bubble": round(statistics.median(bubbles[v]), 4),
            "migrated": metrics["rollout_migrated"],
            "stolen": metrics["rollout_stolen"],
            "ranking": sorted({r.ranking for r in rounds}),
            "identical": tokens == reference,
        })
    base = next((r["makespan_s"] for r in rows if r["scheduler"] == "equal"), rows[0]["makespan_s"])
    for r in rows:
        r["vs_equal"] = round(base / r["makespan_s"], 3) if r["makespan_s"] else None
    return {"replicas": cfg.replicas, "groups": cfg.groups, "repeats": cfg.repeats, "first_epoch": cfg.first_epoch,
            "samples": len(w.requests),
            "steps": len(w.steps()), "tokens": sum(oracle.values()), "checkpoint": w.checkpoint, "rows": rows}


def tokens_per_pass(rounds: list[Round]) -> float:
    """The step metric `tokens_per_pass` over every response of the rounds (a moved one's passes
    on each worker counted)."""
    samples = [s for r in rounds for _, summary in r.summaries for s in summary.samples]
    tokens, passes = sum(s.length for s in samples), sum(s.forward_passes for s in samples)
    return float(speculation_metrics(tokens, 0, 0, passes)["tokens_per_pass"])


def render(result: dict[str, Any], console: Console) -> str:
    cols = ["policy", "makespan_s", "vs_equal", "bubble", "tokens_per_pass", "migrated", "stolen", "identical"]
    table = Table(title=f"{result['samples']} samples on {result['replicas']} rollout workers: rollout makespan "
                        f"(sum of {result['steps']} steps)")
    for c in cols:
        table.add_column(c.replace("_", " "), justify="left" if c == "policy" else "right")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in result["rows"]:
        cells = [f"{100 * r[c]:.1f}%" if c == "bubble" else str(r[c]) for c in cols]
        table.add_row(*cells)
        lines.append("| " + " | ".join(cells) + " |")
    print_table(console, table)
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    rows = result["rows"]
    steps = len(rows[0]["per_step_makespan_s"])
    fig = Figure(figsize=(9, 4.5))
    ax = fig.subplots()
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        ax.bar([s + i * width for s in range(steps)], r["per_step_makespan_s"], width,
               label=f"{r['policy']} ({r['vs_equal']}x)")
    ax.set_xticks([s + 0.4 - width / 2 for s in range(steps)], [str(s + 1) for s in range(steps)])
    ax.set_xlabel("training step of the replayed epoch")
    ax.set_ylabel("rollout makespan, s (measured pass times)")
    ax.set_title(f"{result['replicas']} rollout workers, {result['samples']} samples")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(cfg: ReplicaBenchConfig, out: Path | None, console: Console) -> None:
    result = run_bench(cfg, console)
    md = render(result, console)
    if out is not None:
        report.write_results(out, result, md, lambda path: plot(result, path), "makespan.png", console)
