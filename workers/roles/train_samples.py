"""What the train worker trains on: a step's kept groups as training samples, with GRPO's
group-relative advantages of the (shaped) rewards. Torch math, kept out of groups.py, which the
reward and history workers import."""

from __future__ import annotations

import torch

from rhymerl.algorithms import objectives as obj
from rhymerl.api import RLJob
from rhymerl.workers.roles.groups import Group
from rhymerl.workers.train.trainer import TrainSample


def training_samples(kept: list[Group], job: RLJob, step: int, current: int) -> list[TrainSample]:
    """GRPO group-relative advantages of the (shaped) rewards, one training sample per response,
    with the engine's behaviour log-probabilities; `current`: the policy version being trained."""
    if not kept:
        return []
    algo = job.spec.algorithm
    rewards = torch.tensor([r for g in kept for r in shaped_rewards(g, job)], dtype=torch.float64)
    adv = obj.group_advantages(rewards, algo.group_size, algo.norm_adv_by_std)
    return [TrainSample(g.prompt_ids, r.response_ids, float(adv[i * algo.group_size + k]),
                        f"step {step}: prompt {g.prompt.prompt_id} sample {k}", r.logprobs,
                        g.policy_version == current)
            for i, g in enumerate(kept) for k, r in enumerate(g.results)]


def shaped_rewards(group: Group, job: RLJob) -> list[float]:
    """Verifier rewards, plus DAPO's soft overlong penalty when enabled."""
    ol = job.spec.algorithm.overlong
    if not ol.enabled:
        return group.rewards
    lengths = torch.tensor([len(r.response_ids) for r in group.results])
    pen = obj.overlong_penalty(lengths, job.spec.algorithm.max_response_length, ol.buffer_len, ol.penalty_factor)
    return [r + float(p) for r, p in zip(group.rewards, pen, strict=True)]
