"""Position-keyed sampling: a token is a pure function of (logits, seed, sample id, position).

Gumbel-max with noise from a counter-based hash instead of a stateful RNG. Because no generator
state advances, a speculative engine that verifies a draft computes exactly the token a plain
engine would have drawn at that position, so the two produce identical outputs (DESIGN §4).
The hash is a 32-bit integer mixer evaluated in int64 tensors (works on any torch device).
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF


def _mix32(x: Tensor) -> Tensor:
    """lowbias32 integer finaliser; x holds values in [0, 2^32) in int64."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def sample_key(*parts: object) -> int:
    """A stable 31-bit id for a sample, e.g. sample_key(prompt_id, epoch, index)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def uniform_noise(seed: int, sample_ids: Tensor, positions: Tensor, vocab: int) -> Tensor:
    """U(0,1) noise [..., vocab] keyed by (seed, sample id, position, token)."""
    device = sample_ids.device
    token = torch.arange(vocab, device=device, dtype=torch.int64)
    h = _mix32((sample_ids.to(torch.int64) & _M32) ^ (seed & _M32))
    h = _mix32(h ^ ((positions.to(torch.int64) * 0x9E3779B1) & _M32))
    h = _mix32(h.unsqueeze(-1) ^ ((token * 0x85EBCA77) & _M32))
    return (h.to(torch.float64) + 0.5) / 4294967296.0


def sample_tokens(logits: Tensor, seed: int, sample_ids: Tensor, positions: Tensor,
                  temperature: float, top_p: float = 1.0) -> tuple[Tensor, Tensor]:
    """Draw one token per row of logits [..., V]; sample_ids and positions have the leading shape.

    Returns the tokens and each one's log-probability under the distribution it was drawn from
    (after temperature and top-p: the behaviour policy that off-policy correction divides by).
    Greedy decoding (temperature 0) draws from no distribution: its log-probabilities are those
    of the untempered softmax, what the trainer computes at temperature 0."""
    if temperature == 0.0:
        tokens = logits.argmax(-1)
        return tokens, torch.log_softmax(logits.double(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    scores = logits.double() / temperature
    logp = torch.log_softmax(scores, dim=-1)
    if top_p < 1.0:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        cum = sorted_lp.exp().cumsum(-1)
        drop_sorted = (cum - sorted_lp.exp()) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)  # the nucleus, renormalised
    gumbel = -torch.log(-torch.log(uniform_noise(seed, sample_ids, positions, logits.shape[-1])))
    tokens = (logp + gumbel).argmax(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
