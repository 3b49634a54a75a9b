"""The RL step loop. `_steps` is the whole algorithm, one line per phase: sample a batch (rollout and
reward, with DAPO's dynamic sampling), advantages, train, record the step, update history, save.

`run_steps` yields one `StepMetrics` per finished step; the caller (the local backend, later the
controller pod) decides how to show them. The policy the engine samples from is the module the
trainer updates, so every step's rollout uses the weights of the step before (off-policyness 0).
With `rollout.replicas` > 1 the rollout runs on that many engine replicas placed by the
`scheduling` policy (rollout_pool.py); the tokens are those one engine would produce, since a
token depends only on the logits and (seed, sample id, position) (bit-exact in float64, where
logits do not depend on batch shape; docs/scheduling.md).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rhymerl.algorithms import objectives as obj
from rhymerl.algorithms.scheduling.factory import make_scheduler
from rhymerl.api import RLJob
from rhymerl.workers import dumps, faults
from rhymerl.workers.controller.history import RunHistory
from rhymerl.workers.controller.prompts import Prompt, epoch_order, load_prompts
from rhymerl.workers.controller.rollout_pool import PoolReport, RolloutPool, table_profile
from rhymerl.workers.controller.run_dir import LoopState, RunDir
from rhymerl.workers.controller.speculation import RolloutSpeculation, reachable_batches, speculation_metrics
from rhymerl.workers.controller.step_metrics import StepMetrics
from rhymerl.workers.controller.stopping import GracefulStop
from rhymerl.workers.controller.vllm_rollout import VllmRollout
from rhymerl.workers.model.policy import PolicyModel
from rhymerl.workers.model.registry import load_policy
from rhymerl.workers.model.tokenizer import Tokenizer
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.reward.outcome import Outcome, check_failures
from rhymerl.workers.reward.pool import Scorer, open_scorer
from rhymerl.workers.rollout.engine import GenRequest, GenResult, SamplingParams, TorchEngine
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.rollout.verify_cost import Progress, load_or_measure
from rhymerl.workers.train.guards import NonFiniteError
from rhymerl.workers.train.trainer import Trainer, TrainSample


@dataclass
class Group:
    """One prompt's G responses in a step."""

    prompt: Prompt
    prompt_ids: list[int]
    results: list[GenResult]
    rewards: list[float]
    reward_errors: list[str | None]  # why scoring each response failed; None where it scored
    policy_version: int  # of the weights that generated it
    epoch: int  # the epoch whose visit of the prompt it is


@dataclass(frozen=True)
class GroupSummary:
    """What the step's bookkeeping needs of a group (dynamic sampling, metrics, length history,
    reward failures): a few numbers per response, never its tokens. The distributed runtime ships
    these to the controller while the groups themselves travel between workers by reference."""

    prompt_id: str
    lengths: list[int]
    rewards: list[float]
    reward_errors: list[str | None]
    drafted: int
    accepted: int
    forward_passes: int

    @classmethod
    def of(cls, g: Group) -> GroupSummary:
        return cls(g.prompt.prompt_id, [len(r.response_ids) for r in g.results], g.rewards, g.reward_errors,
                   sum(r.drafted for r in g.results), sum(r.accepted for r in g.results),
                   sum(r.forward_passes for r in g.results))

    @property
    def informative(self) -> bool:
        """Rewards that differ: the group carries a learning signal (DAPO dynamic sampling keeps it)."""
        return len(set(self.rewards)) > 1


@dataclass
class Batch:
    """A step's rollout: every group generated (dumped and learnt from), those kept for training
    (with dynamic sampling, groups whose rewards differ), and where the time went."""

    groups: list[Group] = field(default_factory=list)
    kept: list[Group] = field(default_factory=list)
    rounds: int = 0
    clock: dict[str, float] = field(default_factory=lambda: {"rollout": 0.0, "reward": 0.0, "train": 0.0})
    pool_reports: list[PoolReport] = field(default_factory=list)


def run_steps(job: RLJob, run: RunDir, resume: bool = False,
              profile_progress: Progress | None = None) -> Iterator[StepMetrics]:
    """The job's steps. The reward scorer (worker processes for a user function, its module
    imported first, so a typo fails before any rollout) lives as long as this generator: it is
    closed when the steps end, an exception propagates, or the consumer stops iterating."""
    with open_scorer(job.spec.reward) as scorer:
        yield from _steps(job, run, resume, scorer, profile_progress)


def open_rollout(job: RLJob, model: PolicyModel, tok: Tokenizer, prompts: list[Prompt], history: RunHistory,
                 run: RunDir, resume: bool, profile_progress: Progress | None = None) -> Rollout | VllmRollout:
    """The job's rollout engine: the torch engine (on the trainer's own module) or vLLM."""
    if job.spec.rollout.engine == "vllm":
        return VllmRollout.for_job(job, model, tok, prompts, history, profile_progress)
    assert isinstance(model, TinyLlama), "the spec pairs the torch engine with the native model"
    speculation = RolloutSpeculation.for_job(job, model, history.drafting, profile_progress)
    return Rollout.for_job(job, model, tok, prompts, speculation, history, run, resume)


def _steps(job: RLJob, run: RunDir, resume: bool, scorer: Scorer,
           profile_progress: Progress | None = None) -> Iterator[StepMetrics]:
    """`profile_progress(done, total)` follows the verify-cost profile's measurement (verify_cost.Progress)."""
    spec, algo = job.spec, job.spec.algorithm
    torch.manual_seed(spec.rollout.seed)
    model, tok = load_policy(spec.model)
    trainer = Trainer(model, algo, spec.rollout.temperature)
    state = run.restore(model, trainer.optimizer) if resume else LoopState()
    history = RunHistory.for_job(job)
    if resume and (run.path / dumps.DUMP_DIR).is_dir():
        history.record(dumps.read_run(run.path))
    prompts = load_prompts(spec.data)
    rollout = open_rollout(job, model, tok, prompts, history, run, resume, profile_progress)
    try:
        with GracefulStop() as stop:
            while state.epoch <= algo.epochs:
                t_step = time.perf_counter()
                order = epoch_order(len(prompts), spec.data.seed, state.epoch, spec.data.shuffle)
                faults.point("rollout", state.step + 1)
                rollout.sync_weights(state.policy_version)
                batch = sample_batch(job, rollout, scorer, [prompts[i] for i in order], state)
                engine_stats = rollout.step_stats(batch.groups)
                samples = training_samples(batch.kept, job, state.step + 1)
                faults.point("train", state.step + 1)
                train_stats = train(trainer, samples, batch, run, state.step + 1)

                state.step += 1
                step_records = list(records(batch.groups, state))
                dumps.write_step(run.path, state.step, step_records)
                faults.point("dump", state.step)
                history.record(step_records)
                rollout.keep_cost_evidence()
                state.policy_version += 1 if samples else 0
                metrics = step_metrics([GroupSummary.of(g) for g in batch.groups], batch.rounds, batch.clock,
                                       batch.pool_reports, state, train_stats, **engine_stats,
                                       time_step_s=round(time.perf_counter() - t_step, 3))
                if state.cursor >= len(order):
                    state.epoch, state.cursor = state.epoch + 1, 0
                run.append_metrics(metrics.row())
                check_failures([e for g in batch.groups for e in g.reward_errors], spec.reward, state.step,
                               dumps.dump_path(run.path, state.step))
                faults.point("metrics", state.step)
                saved = state.step % spec.checkpoint.every_steps == 0 or state.epoch > algo.epochs
                if saved:
                    run.save_checkpoint(state, model, trainer.optimizer, spec.checkpoint.keep_last)
                yield metrics
                if stop.requested and state.epoch <= algo.epochs:
                    if not saved:
                        run.save_checkpoint(state, model, trainer.optimizer, spec.checkpoint.keep_last)
                    stop.check(state.step)
    finally:
        rollout.close()


def sample_batch(job: RLJob, rollout: Rollout | VllmRollout, scorer: Scorer, epoch_prompts: list[Prompt],
                 state: LoopState) -> Batch:
    """Roll out and score the next `prompts_per_step` prompts of the epoch. DAPO dynamic sampling
    keeps drawing more of the epoch's prompts (up to `max_gen_batches` rounds) while groups whose
    rewards are all equal (no learning signal) leave the batch short."""
    algo = job.spec.algorithm
    assert algo.dynamic_sampling is not None
    dynamic = algo.dynamic_sampling
    batch = Batch()
    while state.cursor < len(epoch_prompts) and len(batch.kept) < algo.prompts_per_step and (
            batch.rounds == 0 or (dynamic.enabled and batch.rounds < dynamic.max_gen_batches)):
        take = epoch_prompts[state.cursor: state.cursor + algo.prompts_per_step - len(batch.kept)]
        state.cursor += len(take)
        t0 = time.perf_counter()
        results = rollout.generate(take, state.epoch, batch)
        t1 = time.perf_counter()
        groups = score(job, scorer, rollout.tok, take, rollout.encoded, results, state.step + 1,
                       state.policy_version, state.epoch)
        batch.clock["rollout"] += t1 - t0
        batch.clock["reward"] += time.perf_counter() - t1
        batch.groups += groups
        batch.kept += [g for g in groups if not dynamic.enabled or GroupSummary.of(g).informative]
        batch.rounds += 1
    return batch


@dataclass
class Rollout:
    """Generates G responses per prompt: one engine, or `rollout.replicas` engines placed by the
    scheduler (the prompts' encodings and the sampling rule are the same either way)."""

    job: RLJob
    engine: TorchEngine
    tok: Tokenizer
    encoded: dict[str, list[int]]
    params: SamplingParams
    speculation: RolloutSpeculation
    pool: RolloutPool | None

    @classmethod
    def for_job(cls, job: RLJob, model: TinyLlama, tok: Tokenizer, prompts: list[Prompt],
                speculation: RolloutSpeculation, history: RunHistory, run: RunDir, resume: bool) -> Rollout:
        spec, algo = job.spec, job.spec.algorithm
        engine = TorchEngine(model, tok.eos_id, spec.rollout.max_batch_size)
        encoded = {p.prompt_id: tok.prompt_ids(p.text) for p in prompts}
        params = SamplingParams(spec.rollout.temperature, spec.rollout.top_p, spec.rollout.seed,
                                algo.max_response_length)
        pool = rollout_pool(job, engine, params, speculation, history, run, resume) \
            if spec.rollout.replicas > 1 else None
        return cls(job, engine, tok, encoded, params, speculation, pool)

    def sync_weights(self, version: int) -> None:
        """Nothing to do: the engine samples from the module the trainer updates."""

    def close(self) -> None:
        """Nothing to release: the engine is the trainer's module."""

    def step_stats(self, groups: Sequence[Group]) -> dict[str, Any]:
        return {}

    def keep_cost_evidence(self) -> None:
        self.speculation.keep_cost_evidence()

    def generate(self, prompts: list[Prompt], epoch: int, batch: Batch) -> list[GenResult]:
        g = self.job.spec.algorithm.group_size
        reqs = [GenRequest(self.encoded[p.prompt_id], sample_key(p.prompt_id, epoch, k), p.prompt_id)
                for p in prompts for k in range(g)]
        prompt_ids = [p.prompt_id for p in prompts]
        if self.pool is None:
            return self.engine.generate(reqs, self.params, self.speculation.drafts(epoch, prompt_ids))
        results, report = self.pool.run(reqs, self.speculation.replica_drafts(epoch, prompt_ids, self.pool.replicas))
        batch.pool_reports.append(report)
        return results


def score(job: RLJob, scorer: Scorer, tok: Tokenizer, prompts: list[Prompt], encoded: dict[str, list[int]],
          results: list[GenResult], step: int, policy_version: int, epoch: int) -> list[Group]:
    """Reward every response (G per prompt, in order) and group them by prompt."""
    g = job.spec.algorithm.group_size
    spans = [slice(i * g, (i + 1) * g) for i in range(len(prompts))]
    outcomes = score_samples(job, scorer, tok, [(p, k, results[i * g + k]) for i, p in enumerate(prompts)
                                                for k in range(g)], step)
    return [Group(p, encoded[p.prompt_id], results[span], [o.value for o in outcomes[span]],
                  [o.error for o in outcomes[span]], policy_version, epoch) for p, span in zip(prompts, spans, strict=True)]


def score_samples(job: RLJob, scorer: Scorer, tok: Tokenizer, samples: Sequence[tuple[Prompt, int, GenResult]],
                  step: int) -> list[Outcome]:
    """Reward each (prompt, sample index, response); a nan/inf reward stops the run under
    `on_nonfinite: fail`."""
    outcomes = scorer.score([(p.text, tok.decode(r.response_ids), p.answer) for p, _, r in samples])
    if job.spec.algorithm.on_nonfinite == "fail":
        for (p, k, _), o in zip(samples, outcomes, strict=True):
            if o.nonfinite is not None:
                raise NonFiniteError(f"step {step}: prompt {p.prompt_id} sample {k}: the reward function returned "
                                     f"{o.nonfinite}; no weight was changed; set algorithm.on_nonfinite: skip to "
                                     "score such samples as failures (reward.failure_reward) instead")
    return outcomes


def training_samples(kept: list[Group], job: RLJob, step: int) -> list[TrainSample]:
    """GRPO group-relative advantages of the (shaped) rewards, one training sample per response."""
    if not kept:
        return []
    algo = job.spec.algorithm
    rewards = torch.tensor([r for g in kept for r in shaped_rewards(g, job)], dtype=torch.float64)
    adv = obj.group_advantages(rewards, algo.group_size, algo.norm_adv_by_std)
    return [TrainSample(g.prompt_ids, r.response_ids, float(adv[i * algo.group_size + k]),
                        f"step {step}: prompt {g.prompt.prompt_id} sample {k}")
            for i, g in enumerate(kept) for k, r in enumerate(g.results)]


def train(trainer: Trainer, samples: list[TrainSample], batch: Batch, run: RunDir, step: int) -> dict[str, float]:
    """One policy update on the batch (none without samples); what `on_nonfinite: skip` left out is noted."""
    t0 = time.perf_counter()
    stats = trainer.step(samples) if samples else {}
    batch.clock["train"] = time.perf_counter() - t0
    if samples and (trainer.skipped_samples or trainer.skipped_updates):
        run.note(f"step {step}: on_nonfinite=skip left out {len(trainer.skipped_samples)} sample(s) "
                 f"{trainer.skipped_samples} and {trainer.skipped_updates} update(s) with a nan/inf value")
    return stats


def rollout_pool(job: RLJob, engine: TorchEngine, params: SamplingParams, speculation: RolloutSpeculation,
                 history: RunHistory, run: RunDir, resume: bool) -> RolloutPool:
    """The replicas and their scheduler. The cost model is the engine's measured pass times (the
    profile speculation uses, measured now if speculation is off). The scheduler ranks by the run's
    length history (which a resumed run has rebuilt from its dumps) and continues the batch
    numbering (HistoPipe alternates its layout on odd and even batches), so it makes the decisions
    the uninterrupted run would have made."""
    spec = job.spec
    cost = speculation.control.profile or load_or_measure(engine.model, batches=reachable_batches(job))
    sched = make_scheduler(spec.scheduling, spec.rollout.replicas, seed=spec.rollout.seed, max_off_policy=0,
                           profile=table_profile(cost, engine.max_batch_size), history=history.lengths,
                           learns_lengths=False)
    first_step = 1
    if resume:
        first_step += sum(m.gen_rounds for m in run.step_metrics())
    return RolloutPool(engine, sched, params, first_step)


def shaped_rewards(group: Group, job: RLJob) -> list[float]:
    """Verifier rewards, plus DAPO's soft overlong penalty when enabled."""
    ol = job.spec.algorithm.overlong
    if not ol.enabled:
        return group.rewards
    lengths = torch.tensor([len(r.response_ids) for r in group.results])
    pen = obj.overlong_penalty(lengths, job.spec.algorithm.max_response_length, ol.buffer_len, ol.penalty_factor)
    return [r + float(p) for r, p in zip(group.rewards, pen, strict=True)]


def records(groups: list[Group], state: LoopState) -> Iterator[dumps.RolloutRecord]:
    for g in groups:
        for k, (res, reward, error) in enumerate(zip(g.results, g.rewards, g.reward_errors, strict=True)):
            yield dumps.RolloutRecord(
                step=state.step, epoch=g.epoch, prompt_id=g.prompt.prompt_id, sample_index=k,
                prompt_len=len(g.prompt_ids), prompt_ids=g.prompt_ids, response_ids=res.response_ids,
                reward=reward, reward_error=error, finish_reason="stop" if res.finish_reason == "stop" else "length",
                policy_version=g.policy_version,
                speculation=dumps.SpeculationStats(drafted=res.drafted, accepted=res.accepted,
                                                   forward_passes=res.forward_passes))


def step_metrics(groups: Sequence[GroupSummary], rounds: int, clock: dict[str, float],
                 pool_reports: Sequence[PoolReport], state: LoopState, train_stats: dict[str, float],
                 **extra: Any) -> StepMetrics:
    """The step's row; `extra` are fields only one backend has (the distributed runtime's)."""
    lengths = [n for g in groups for n in g.lengths]
    rewards = [x for g in groups for x in g.rewards]
    tokens = sum(lengths)
    pool = functools.reduce(PoolReport.merged, pool_reports).metrics() if pool_reports else {}
    return StepMetrics(
        step=state.step,
        epoch=state.epoch,
        policy_version=state.policy_version,
        prompts=len(groups),
        samples=len(lengths),
        gen_rounds=rounds,
        **{f"time_{k}_s": round(v, 3) for k, v in clock.items()},
        rollout_tokens=tokens,
        rollout_tokens_per_s=round(tokens / max(clock["rollout"], 1e-9), 1),
        response_length_mean=round(sum(lengths) / max(len(lengths), 1), 1),
        response_length_max=max(lengths, default=0),
        reward_mean=round(sum(rewards) / max(len(rewards), 1), 4),
        reward_failures=sum(e is not None for g in groups for e in g.reward_errors),
        zero_std_frac=round(sum(len(set(g.rewards)) <= 1 for g in groups) / max(len(groups), 1), 4),
        **{k: (round(v, 5) if math.isfinite(v) else v) for k, v in train_stats.items()},
        **speculation_metrics(tokens, sum(g.drafted for g in groups), sum(g.accepted for g in groups),
                              sum(g.forward_passes for g in groups)),
        **pool,
        **extra,
    )
