"""The local backend: run an RLJob on this machine, in-process, with progress and a run folder.

The same step loop runs in the controller pod on a cluster; here the rollout engine, the reward
verifier and the trainer share one process and one copy of the weights, which keeps a laptop run
fast and its results bit-reproducible for a given seed and torch build. `rollout.replicas` > 1
runs that many engine replicas in this process, stepped in turn and placed by the scheduling
policy, so the scheduler's decisions can be exercised and measured on one machine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rhymerl.api import RLJob
from rhymerl.workers.controller.loop import run_steps
from rhymerl.workers.controller.plots import plot_metrics
from rhymerl.workers.controller.prompts import load_prompts
from rhymerl.workers.controller.run_dir import RunDir


def default_out(job: RLJob) -> Path:
    return Path("runs") / f"{job.metadata.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def step_line(row: dict[str, Any]) -> str:
    def get(key: str, fmt: str) -> str:
        v = row.get(key)
        return "-" if v is None else format(v, fmt)

    replicas = ""
    if "rollout_replicas" in row:
        replicas = (f" | {row['rollout_replicas']} replicas makespan {get('rollout_makespan_s', '.1f')}s "
                    f"bubble {get('rollout_bubble', '.0%')} migrated {row['rollout_migrated']}")
    return (f"step {row['step']:>3} ep {row['epoch']} | reward {get('reward_mean', '.3f')} "
            f"zero-std {get('zero_std_frac', '.2f')} | len {get('response_length_mean', '.0f')}/"
            f"{row['response_length_max']} | rollout {get('time_rollout_s', '.1f')}s "
            f"{get('rollout_tokens_per_s', '.0f')} tok/s spec {get('spec_rate', '.2f')} "
            f"acc {get('spec_acceptance', '.2f')} tok/pass {get('tokens_per_pass', '.2f')}{replicas} | "
            f"reward {get('time_reward_s', '.2f')}s | train {get('time_train_s', '.1f')}s | "
            f"kl {get('kl', '.4f')} ent {get('entropy', '.3f')} gnorm {get('grad_norm', '.3f')}")


def epoch_rewards(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Sample-weighted mean reward per epoch."""
    sums: dict[int, list[float]] = {}
    for r in rows:
        acc = sums.setdefault(r["epoch"], [0.0, 0.0])
        acc[0] += r["reward_mean"] * r["samples"]
        acc[1] += r["samples"]
    return {e: s / n for e, (s, n) in sorted(sums.items()) if n}


def check_local(job: RLJob) -> None:
    """Reject, before anything is written, what the local backend cannot run."""
    if job.spec.rollout.engine != "torch":
        raise ValueError(f"spec.rollout.engine: '{job.spec.rollout.engine}' needs a cluster; "
                         "the local backend runs the torch engine")
    if job.spec.rollout.speculation.method == "draft-model":
        raise ValueError("spec.rollout.speculation.method: draft-model needs the vllm engine; "
                         "the torch engine supports none, history and ngram")
    if job.spec.rollout.replicas > 1 and job.spec.scheduling.policy == "lpt":
        raise ValueError("spec.scheduling.policy: lpt places samples by their true lengths, which only a "
                         "simulator knows; choose histopipe, equal, skew-aware, realloc or async")


def run_local(job: RLJob | None, out: Path | None, console: Console | None = None) -> dict[int, float]:
    """Run `job` into `out`; with job None, resume the run already in `out`. Returns reward per epoch."""
    console = console or Console()
    resume = job is None
    if job is None:
        if out is None:
            raise ValueError("resuming needs the run folder")
        run = RunDir(out)
        job = run.load_job()
    else:
        check_local(job)
        run = RunDir(out or default_out(job))
        run.create(job)
    total = job.spec.algorithm.epochs * len(load_prompts(job.spec.data))
    console.print(f"[bold]rhymerl[/] run {job.metadata.name} -> {run.path}")
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("prompts"), TimeElapsedColumn(), console=console)
    with progress:
        task = progress.add_task("rollout+train", total=total)
        for row in run_steps(job, run, resume):
            progress.update(task, completed=min(total, sum(m["prompts"] for m in run.metrics())))
            console.print(step_line(row), highlight=False, soft_wrap=True)
    rows = run.metrics()
    plot = plot_metrics(rows, run.path / "plots" / "metrics.png")
    per_epoch = epoch_rewards(rows)
    for epoch, reward in per_epoch.items():
        console.print(f"epoch {epoch}: mean reward {reward:.4f}")
    console.print(f"run folder {run.path} (plots: {plot.name}, seed {job.spec.rollout.seed})")
    return per_epoch
