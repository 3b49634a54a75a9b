"""Loss math for GRPO and DAPO: pure tensor functions, no model, no I/O.

Notation: B responses, T response tokens (right-padded), `mask` [B, T] marks real tokens.
The aggregation modes follow veRL's names:

- ``token-mean`` (DAPO): every token of the batch weighs the same.
- ``seq-mean-token-mean`` (GRPO paper): average over each response, then over responses.
- ``seq-mean-token-sum-norm`` (Dr. GRPO): token sum divided by B * max_response_length.

Each aggregation is a sum of per-token terms over a denominator fixed for the whole mini-batch, so
a mini-batch split into micro-batches gives the same gradient as one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

LossAgg = str


def group_advantages(rewards: Tensor, group_size: int, norm_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO advantages: reward minus the group mean, optionally over the group std (unbiased).

    `rewards` is [P * G] ordered group by group; a group whose rewards are all equal gets zeros.
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size).double()
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if norm_by_std:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.reshape(-1).to(rewards.dtype)


def overlong_penalty(lengths: Tensor, max_len: int, buffer_len: int, factor: float) -> Tensor:
    """DAPO soft overlong punishment: 0 up to max_len - buffer, then linearly down to -factor at max_len."""
    start = max_len - buffer_len
    return -factor * ((lengths - start).clamp(min=0).to(torch.float64) / buffer_len).clamp(max=1.0)


@dataclass(frozen=True)
class Denominators:
    """Normalisers of one mini-batch, computed before it is split into micro-batches."""

    mode: LossAgg
    tokens: float          # real tokens in the mini-batch
    sequences: float       # responses in the mini-batch
    max_response_length: int


def denominators(mask: Tensor, mode: LossAgg, max_response_length: int) -> Denominators:
    return Denominators(mode, float(mask.sum().item()), float(mask.shape[0]), max_response_length)


def aggregate(per_token: Tensor, mask: Tensor, den: Denominators) -> Tensor:
    """Reduce per-token values [b, T] of (part of) a mini-batch to its share of the scalar loss."""
    masked = per_token * mask
    if den.mode == "token-mean":
        return masked.sum() / max(den.tokens, 1.0)
    if den.mode == "seq-mean-token-mean":
        per_seq = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return per_seq.sum() / max(den.sequences, 1.0)
    if den.mode == "seq-mean-token-sum-norm":
        return masked.sum() / max(den.sequences * den.max_response_length, 1.0)
    raise ValueError(f"loss_agg_mode: unknown mode {den.mode!r}")


def clipped_policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor,
                        clip_low: float, clip_high: float) -> tuple[Tensor, Tensor]:
    """PPO/GRPO clipped surrogate per token, and where clipping was active.

    loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A), r = exp(logp - old_logp);
    `advantages` is [B] (one per response, broadcast over tokens) or [B, T].
    """
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped).to(logp.dtype)


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1 >= 0."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def token_logprobs_and_entropy(logits: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """log pi(token) and the entropy of pi at each position; logits [B, T, V], tokens [B, T]."""
    logp_all = torch.log_softmax(logits.float(), dim=-1)
    logp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def importance_ratios(old_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """pi_old / mu per token [B, T]: the trainer's old policy over the behaviour policy the rollout
    engine drew each token from (off-policy correction, veRL's `rollout_is`). `level` token: each
    token's own ratio; sequence: the product over the response, the same for each of its tokens.
    Padding (mask 0) gets 1."""
    log_ratio = (old_logp - behaviour_logp) * mask
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(mask)
    elif level != "token":
        raise ValueError(f"importance level: unknown level {level!r}")
    return torch.where(mask > 0, torch.exp(log_ratio.clamp(max=80.0)), torch.ones_like(mask))


def truncated(ratios: Tensor, cap: float) -> Tensor:
    """Truncated importance weights (TIS): the ratios, at most `cap`, with no gradient."""
    return ratios.detach().clamp(max=cap)
