"""The gap between the rollout engine's and the trainer's log-probabilities of the same tokens.

The weights a rollout engine samples with must be the trainer's: on the tokens vLLM generated,
vLLM's reported log-probabilities and the trainer's own (both before temperature) agree to float
rounding when the weights arrived, and differ by whole nats when a load failed or loaded the wrong
tensors (the step's `rollout_logprob_diff_mean` / `_max`, veRL's `training/rollout_probs_diff_*`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rhymerl.workers.model.policy import PolicyModel
from rhymerl.workers.rollout.engine import GenResult


@torch.no_grad()
def logprob_gap(model: PolicyModel, samples: Sequence[tuple[list[int], GenResult]]) -> tuple[float, float] | None:
    """Mean and largest |trainer - rollout| log-probability over every response token that carries
    the rollout's log-probability, the trainer's computed before temperature like vLLM's; None when
    no token carries one."""
    diffs = []
    for prompt, result in samples:
        if not result.logprobs or not result.response_ids:
            continue
        tokens = torch.tensor([prompt + result.response_ids])
        logp = torch.log_softmax(model(tokens)[0].double(), dim=-1)
        n = len(prompt)
        picked = logp[n - 1: n - 1 + len(result.response_ids)].gather(
            1, torch.tensor(result.response_ids).unsqueeze(1)).squeeze(1)
        diffs.append((picked - torch.tensor(result.logprobs, dtype=torch.float64)).abs())
    if not diffs:
        return None
    every = torch.cat(diffs)
    return float(every.mean()), float(every.max())
