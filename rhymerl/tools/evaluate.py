"""`rhymerl eval`: a run's policy before training and at its checkpoints, scored on prompts it did not
train on (pass@1), the way the job scores its rollouts.

The reward curve of a run is measured on the prompts it trains on; whether the policy got better is a
question for held-out prompts. Each policy generates `samples` responses per prompt with the torch
engine at the job's sampling settings (temperature, top-p, length limit, stop tokens; sample keys of
their own, so every policy answers the same draws), the job's reward scores them, and each policy's
row holds the mean reward and pass@1: the share of responses that earned the full reward (1.0).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rhymerl.api import RLJob
from rhymerl.errors import UserError
from rhymerl.workers.model.policy import read_weights
from rhymerl.workers.model.registry import load_native_policy
from rhymerl.workers.model.tokenizer import Tokenizer
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.reward.pool import open_scorer
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.run_folder.checkpoints import step_of
from rhymerl.workers.run_folder.run_dir import RunDir
from rhymerl.workers.task.prompts import Prompt, load_prompts, prompt_text, prompt_tokens

EVAL_KEY = "eval"
"""Sample keys (prompt id, EVAL_KEY, k): never a training sample's, the same for every policy."""


@dataclass(frozen=True)
class PolicyScore:
    policy: str
    """'initial' (the job's model) or 'step N' (the run's checkpoint after step N)."""
    step: int
    mean_reward: float
    pass_at_1: float
    mean_length: float
    seconds: float


@dataclass(frozen=True)
class Policy:
    name: str
    step: int
    weights: Path | None
    """The checkpoint folder (None: the job's own model)."""


def run_policies(run: RunDir, which: str) -> list[Policy]:
    """`which`: 'initial,last' (the default), 'all', or a comma-separated list of 'initial', 'last' and
    step numbers; a step with no checkpoint is a UserError naming the ones there are."""
    saved = {step: folder for folder in run.checkpoint_dirs() if (step := step_of(folder)) is not None}
    wanted = "initial," + ",".join(map(str, sorted(saved))) if which == "all" else which
    out: list[Policy] = []
    for part in (p.strip() for p in wanted.split(",") if p.strip()):
        if part == "initial":
            out.append(Policy("initial", 0, None))
            continue
        if part != "last" and not part.isdigit():
            raise UserError(f"--checkpoints: '{part}' is not 'initial', 'last', 'all' or a step number")
        step = max(saved, default=None) if part == "last" else int(part)
        if step not in saved:
            have = ", ".join(map(str, sorted(saved))) or "none"
            raise UserError(f"--checkpoints: {run.path} has no checkpoint of step {part} (checkpoints: {have})")
        out.append(Policy(f"step {step}", step, saved[step]))
    return list({p.name: p for p in out}.values())


def requests(prompts: Sequence[Prompt], tok: Tokenizer, samples: int) -> list[GenRequest]:
    return [GenRequest(prompt_tokens(tok, p), sample_key(p.prompt_id, EVAL_KEY, k), p.prompt_id)
            for p in prompts for k in range(samples)]


def score_policy(job: RLJob, model: TinyLlama, tok: Tokenizer, prompts: Sequence[Prompt], samples: int,
                 policy: Policy, progress: Callable[[int, int], None] | None = None) -> PolicyScore:
    """Generate and score `samples` responses per prompt with `model` (already holding the policy's weights)."""
    spec = job.spec
    engine = TorchEngine(model, tok.stop_ids, spec.rollout.max_batch_size)
    params = SamplingParams(spec.rollout.temperature, spec.rollout.top_p, spec.rollout.seed,
                            spec.algorithm.max_response_length)
    reqs = requests(prompts, tok, samples)
    began = time.perf_counter()
    results: list[GenResult] = []
    for start in range(0, len(reqs), spec.rollout.max_batch_size):
        results += engine.generate(reqs[start: start + spec.rollout.max_batch_size], params)
        if progress is not None:
            progress(len(results), len(reqs))
    seconds = time.perf_counter() - began
    texts = [(prompt_text(tok, p), tok.decode(r.response_ids), p.answer, p.reward_extras())
             for p, r in zip((p for p in prompts for _ in range(samples)), results, strict=True)]
    with open_scorer(spec.reward) as scorer:
        rewards = [o.value for o in scorer.score(texts)]
    return PolicyScore(policy.name, policy.step, sum(rewards) / len(rewards),
                       sum(r >= 1.0 for r in rewards) / len(rewards),
                       sum(len(r.response_ids) for r in results) / len(results), round(seconds, 2))


def evaluate(job: RLJob, run: RunDir, policies: Sequence[Policy], samples: int,
             progress: Callable[[str, int, int], None] | None = None) -> list[PolicyScore]:
    """Every policy of `policies` on the prompts of `job.spec.data` (with the caller's overrides: a held-out
    split or file), `samples` responses per prompt."""
    if job.spec.model.implementation != "native":
        raise UserError("rhymerl eval runs the torch engine: model.implementation must be native")
    prompts = load_prompts(job.spec.data)
    model, tok = load_native_policy(job.spec.model)
    initial = {k: v.clone() for k, v in model.hf_state_dict().items()}
    scores = []
    for policy in policies:
        model.load_hf_state_dict(initial if policy.weights is None else read_weights(policy.weights))
        report = None if progress is None else (lambda d, t, name=policy.name: progress(name, d, t))
        with torch.inference_mode():
            scores.append(score_policy(job, model, tok, prompts, samples, policy, report))
    return scores


def table_md(scores: Sequence[PolicyScore], job: RLJob, samples: int, prompts: int) -> str:
    spec = job.spec
    rows = ["| policy | mean reward | pass@1 | mean length | seconds |", "|---|---:|---:|---:|---:|"]
    rows += [f"| {s.policy} | {s.mean_reward:.4f} | {s.pass_at_1:.4f} | {s.mean_length:.1f} | {s.seconds:.1f} |"
             for s in scores]
    return (f"{prompts} prompts of {spec.data.source} x {samples} samples, temperature {spec.rollout.temperature}, "
            f"at most {spec.algorithm.max_response_length} tokens\n\n" + "\n".join(rows) + "\n")


def results(scores: Sequence[PolicyScore]) -> list[dict[str, object]]:
    return [asdict(s) for s in scores]


def plot(scores: Sequence[PolicyScore], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([s.step for s in scores], [s.pass_at_1 for s in scores], marker="o", label="pass@1")
    ax.plot([s.step for s in scores], [s.mean_reward for s in scores], marker="x", ls="--", label="mean reward")
    ax.set_xlabel("training step (0: before training)")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(run_path: Path, overrides: list[str], samples: int, which: str, out: Path | None) -> list[PolicyScore]:
    """The command: policies scored with a progress bar, a table printed, results written to `out`."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rhymerl.api.load import parse_job
    from rhymerl.tools.bench.report import write_results
    from rhymerl.workers.run_folder.run_dir import SPEC

    run = RunDir(run_path)
    job = parse_job((run_path / SPEC).read_bytes(), str(run_path / SPEC), overrides)
    policies = run_policies(run, which)
    console = Console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        tasks = {p.name: bar.add_task(f"eval {p.name}", total=None) for p in policies}
        scores = evaluate(job, run, policies, samples,
                          lambda name, done, total: bar.update(tasks[name], completed=done, total=total))
    prompts = len(load_prompts(job.spec.data))
    table = table_md(scores, job, samples, prompts)
    console.print(table, markup=False, highlight=False)
    if out is not None:
        write_results(out, results(scores), table, lambda p: plot(scores, p), "pass_at_1.png", console)
    return scores
