"""The RL step loop, read top to bottom as the algorithm: rollout, reward, advantages, update.

`run_steps` yields one metrics row per finished step; the caller (the local backend, later the
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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from rhymerl.algorithms import objectives as obj
from rhymerl.algorithms.scheduling.factory import make_scheduler
from rhymerl.api import RLJob
from rhymerl.workers import dumps, faults
from rhymerl.workers.controller.prompts import Prompt, epoch_order, load_prompts
from rhymerl.workers.controller.rollout_pool import PoolReport, RolloutPool, prime_history, table_profile
from rhymerl.workers.controller.run_dir import LoopState, RunDir
from rhymerl.workers.controller.speculation import Speculation, reachable_batches
from rhymerl.workers.model.registry import load_policy
from rhymerl.workers.reward.outcome import check_failures
from rhymerl.workers.reward.pool import Scorer, open_scorer
from rhymerl.workers.rollout.engine import GenRequest, GenResult, SamplingParams, TorchEngine
from rhymerl.workers.rollout.profile import Progress, load_or_measure
from rhymerl.workers.rollout.sampling import sample_key
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


def run_steps(job: RLJob, run: RunDir, resume: bool = False,
              profile_progress: Progress | None = None) -> Iterator[dict[str, Any]]:
    """The job's steps. The reward scorer (worker processes for a user function, its module
    imported first, so a typo fails before any rollout) lives as long as this generator: it is
    closed when the steps end, an exception propagates, or the consumer stops iterating."""
    with open_scorer(job.spec.reward) as scorer:
        yield from _steps(job, run, resume, scorer, profile_progress)


def _steps(job: RLJob, run: RunDir, resume: bool, scorer: Scorer,
           profile_progress: Progress | None = None) -> Iterator[dict[str, Any]]:
    """`profile_progress(done, total)` follows the verify-cost profile's measurement (profile.Progress)."""
    spec, algo = job.spec, job.spec.algorithm
    torch.manual_seed(spec.rollout.seed)
    model, tok = load_policy(spec.model)
    prompts = load_prompts(spec.data)
    encoded = {p.prompt_id: [tok.bos_id, *tok.encode(p.text)] for p in prompts}
    engine = TorchEngine(model, tok.eos_id, spec.rollout.max_batch_size)
    trainer = Trainer(model, algo, spec.rollout.temperature)
    state = run.restore(model, trainer.optimizer) if resume else LoopState()
    speculation = Speculation.for_job(job, model, run.path if resume else None, profile_progress)
    params = SamplingParams(spec.rollout.temperature, spec.rollout.top_p, spec.rollout.seed, algo.max_response_length)
    assert algo.dynamic_sampling is not None
    pool = rollout_pool(job, engine, params, speculation, run, resume) if spec.rollout.replicas > 1 else None
    reports: list[PoolReport] = []

    def rollout(batch: list[Prompt], epoch: int, clock: dict[str, float]) -> list[Group]:
        reqs = [GenRequest(encoded[p.prompt_id], sample_key(p.prompt_id, epoch, k), p.prompt_id)
                for p in batch for k in range(algo.group_size)]
        prompt_ids = [p.prompt_id for p in batch]
        t0 = time.perf_counter()
        if pool is None:
            results = engine.generate(reqs, params, speculation.drafts(epoch, prompt_ids))
        else:
            results, report = pool.run(reqs, speculation.replica_drafts(epoch, prompt_ids, pool.replicas))
            reports.append(report)
        t1 = time.perf_counter()
        spans = [slice(i * algo.group_size, (i + 1) * algo.group_size) for i in range(len(batch))]
        outcomes = scorer.score([(p.text, tok.decode(r.response_ids), p.answer)
                                 for p, span in zip(batch, spans, strict=True) for r in results[span]])
        for i, o in enumerate(outcomes):
            if o.nonfinite is not None and algo.on_nonfinite == "fail":
                p = batch[i // algo.group_size]
                raise NonFiniteError(f"step {state.step + 1}: prompt {p.prompt_id} sample {i % algo.group_size}: the "
                                     f"reward function returned {o.nonfinite}; no weight was changed; set "
                                     "algorithm.on_nonfinite: skip to score such samples as failures "
                                     "(reward.failure_reward) instead")
        groups = []
        for p, span in zip(batch, spans, strict=True):
            groups.append(Group(p, encoded[p.prompt_id], results[span], [o.value for o in outcomes[span]],
                                [o.error for o in outcomes[span]]))
        clock["rollout"] += t1 - t0
        clock["reward"] += time.perf_counter() - t1
        return groups

    while state.epoch <= algo.epochs:
        order = epoch_order(len(prompts), spec.data.seed, state.epoch, spec.data.shuffle)
        clock = {"rollout": 0.0, "reward": 0.0, "train": 0.0}
        faults.point("rollout", state.step + 1)
        reports.clear()
        groups: list[Group] = []
        kept: list[Group] = []
        rounds = 0
        # DAPO dynamic sampling: keep drawing this epoch's prompts until the batch has groups with signal.
        while state.cursor < len(order) and len(kept) < algo.prompts_per_step and (
                rounds == 0 or (algo.dynamic_sampling.enabled and rounds < algo.dynamic_sampling.max_gen_batches)):
            take = order[state.cursor: state.cursor + algo.prompts_per_step - len(kept)]
            state.cursor += len(take)
            fresh = rollout([prompts[i] for i in take], state.epoch, clock)
            groups += fresh
            kept += [g for g in fresh if not algo.dynamic_sampling.enabled or len(set(g.rewards)) > 1]
            rounds += 1

        rewards = torch.tensor([r for g in kept for r in shaped_rewards(g, job)], dtype=torch.float64)
        samples: list[TrainSample] = []
        if kept:
            adv = obj.group_advantages(rewards, algo.group_size, algo.norm_adv_by_std)
            samples = [TrainSample(g.prompt_ids, r.response_ids, float(adv[i * algo.group_size + k]),
                                   f"step {state.step + 1}: prompt {g.prompt.prompt_id} sample {k}")
                       for i, g in enumerate(kept) for k, r in enumerate(g.results)]
        faults.point("train", state.step + 1)
        t0 = time.perf_counter()
        train_stats = trainer.step(samples) if samples else {}
        clock["train"] = time.perf_counter() - t0
        if samples and (trainer.skipped_samples or trainer.skipped_updates):
            run.note(f"step {state.step + 1}: on_nonfinite=skip left out {len(trainer.skipped_samples)} sample(s) "
                     f"{trainer.skipped_samples} and {trainer.skipped_updates} update(s) with a nan/inf value")

        state.step += 1
        step_records = list(records(groups, state))
        dumps.write_step(run.path, state.step, step_records)
        faults.point("dump", state.step)
        speculation.remember(step_records)
        state.policy_version += 1 if samples else 0
        row = step_metrics(groups, state, clock, train_stats, rounds) | speculation.metrics(groups)
        if reports:
            row |= functools.reduce(PoolReport.merged, reports).metrics()
        if state.cursor >= len(order):
            state.epoch, state.cursor = state.epoch + 1, 0
        run.append_metrics(row)
        check_failures([e for g in groups for e in g.reward_errors], spec.reward, state.step,
                       dumps.dump_path(run.path, state.step))
        faults.point("metrics", state.step)
        if state.step % spec.checkpoint.every_steps == 0 or state.epoch > algo.epochs:
            run.save_checkpoint(state, model, trainer.optimizer, spec.checkpoint.keep_last)
        yield row


def rollout_pool(job: RLJob, engine: TorchEngine, params: SamplingParams, speculation: Speculation, run: RunDir,
                 resume: bool) -> RolloutPool:
    """The replicas and their scheduler. The cost model is the engine's measured pass times (the
    profile speculation uses, measured now if speculation is off). The scheduler learns lengths as
    groups finish; a resumed run first replays its dumps into that history and continues the
    batch numbering (HistoPipe alternates its layout on odd and even batches), so it makes the
    decisions the uninterrupted run would have made."""
    spec = job.spec
    cost = speculation.control.profile or load_or_measure(engine.model, batches=reachable_batches(job))
    sched = make_scheduler(spec.scheduling, spec.rollout.replicas, seed=spec.rollout.seed, max_off_policy=0,
                           profile=table_profile(cost, engine.max_batch_size))
    first_step = 1
    if resume and (run.path / dumps.DUMP_DIR).is_dir():
        first_step += sum(int(r.get("gen_rounds", 1)) for r in run.metrics())
        prime_history(sched, dumps.read_run(run.path))
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
                step=state.step, epoch=state.epoch, prompt_id=g.prompt.prompt_id, sample_index=k,
                prompt_len=len(g.prompt_ids), prompt_ids=g.prompt_ids, response_ids=res.response_ids,
                reward=reward, reward_error=error, finish_reason="stop" if res.finish_reason == "stop" else "length",
                policy_version=state.policy_version,
                spec=dumps.SpecStats(drafted=res.drafted, accepted=res.accepted,
                                     forward_passes=res.forward_passes))


def step_metrics(groups: list[Group], state: LoopState, clock: dict[str, float],
                 train_stats: dict[str, float], rounds: int) -> dict[str, Any]:
    lengths = [len(r.response_ids) for g in groups for r in g.results]
    rewards = [x for g in groups for x in g.rewards]
    tokens = sum(lengths)
    return {
        "step": state.step,
        "epoch": state.epoch,
        "policy_version": state.policy_version,
        "prompts": len(groups),
        "samples": len(lengths),
        "gen_rounds": rounds,
        **{f"time_{k}_s": round(v, 3) for k, v in clock.items()},
        "rollout_tokens": tokens,
        "rollout_tokens_per_s": round(tokens / max(clock["rollout"], 1e-9), 1),
        "response_length_mean": round(sum(lengths) / max(len(lengths), 1), 1),
        "response_length_max": max(lengths, default=0),
        "reward_mean": round(sum(rewards) / max(len(rewards), 1), 4),
        "reward_failures": sum(e is not None for g in groups for e in g.reward_errors),
        "zero_std_frac": round(sum(len(set(g.rewards)) <= 1 for g in groups) / max(len(groups), 1), 4),
        **{k: (round(v, 5) if math.isfinite(v) else v) for k, v in train_stats.items()},
    }
