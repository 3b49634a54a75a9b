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


def sample_key(*parts: object) -> int:
    """A stable 31-bit id for a sample, e.g. sample_key(prompt_id, epoch, index)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


_TOKEN_HASHES: dict[tuple[int, str], Tensor] = {}  # (vocabulary, device) -> each token's hash term


def _token_hashes(vocab: int, device: torch.device) -> Tensor:
    """Each token's term of the noise hash, the same for every row (made once per vocabulary and device)."""
    key = (vocab, str(device))
    cached = _TOKEN_HASHES.get(key)
    if cached is None:
        cached = _TOKEN_HASHES[key] = (torch.arange(vocab, device=device, dtype=torch.int64) * 0x85EBCA77) & _M32
    return cached


def _mix32_(x: Tensor) -> Tensor:
    """lowbias32 integer finaliser, in place (rows x vocabulary is large: no new tensor per operation);
    x holds values in [0, 2^32) in int64."""
    x.bitwise_xor_(x >> 16).mul_(0x7FEB352D).bitwise_and_(_M32)
    x.bitwise_xor_(x >> 15).mul_(0x846CA68B).bitwise_and_(_M32)
    return x.bitwise_xor_(x >> 16)


def _row_hashes(seed: int, sample_ids: Tensor, positions: Tensor) -> Tensor:
    h = _mix32_((sample_ids.to(torch.int64) & _M32) ^ (seed & _M32))
    return _mix32_(h ^ ((positions.to(torch.int64) * 0x9E3779B1) & _M32))


def uniform_noise(seed: int, sample_ids: Tensor, positions: Tensor, vocab: int) -> Tensor:
    """U(0,1) noise [..., vocab] keyed by (seed, sample id, position, token)."""
    h = _mix32_(_row_hashes(seed, sample_ids, positions).unsqueeze(-1) ^ _token_hashes(vocab, sample_ids.device))
    return h.to(torch.float64).add_(0.5).div_(4294967296.0)


def gumbel_noise(seed: int, sample_ids: Tensor, positions: Tensor, vocab: int) -> Tensor:
    """-log(-log(U)) of `uniform_noise`, computed in place: the noise Gumbel-max adds to log-probabilities."""
    return uniform_noise(seed, sample_ids, positions, vocab).log_().neg_().log_().neg_()


BLOCK_ELEMENTS = 2**19
"""Rows x vocabulary sampled together (4 MB of float64): a block's temporaries stay in cache where a
large pass's do not (at SmolLM2's 49152 tokens, 128 rows in one block took 4.5x the time of blocks of
8-16 rows here); a small vocabulary's pass stays one block, so few rows cost no extra calls."""


def sample_tokens(logits: Tensor, seed: int, sample_ids: Tensor, positions: Tensor,
                  temperature: float, top_p: float = 1.0) -> tuple[Tensor, Tensor]:
    """Draw one token per row of logits [..., V]; sample_ids and positions have the leading shape.

    Returns the tokens and each one's log-probability under the distribution it was drawn from
    (after temperature and top-p: the behaviour policy that off-policy correction divides by).
    Greedy decoding (temperature 0) draws from no distribution: its log-probabilities are those
    of the untempered softmax, what the trainer computes at temperature 0."""
    shape = logits.shape[:-1]
    rows, ids, pos = logits.reshape(-1, logits.shape[-1]), sample_ids.reshape(-1), positions.reshape(-1)
    step = max(1, BLOCK_ELEMENTS // rows.shape[-1])
    blocks = [_sample_rows(rows[i:i + step], seed, ids[i:i + step], pos[i:i + step], temperature, top_p)
              for i in range(0, max(rows.shape[0], 1), step)]  # no rows: one empty block, empty results
    if len(blocks) == 1:
        return blocks[0][0].reshape(shape), blocks[0][1].reshape(shape)
    return torch.cat([b[0] for b in blocks]).reshape(shape), torch.cat([b[1] for b in blocks]).reshape(shape)


def _sample_rows(logits: Tensor, seed: int, sample_ids: Tensor, positions: Tensor,
                 temperature: float, top_p: float) -> tuple[Tensor, Tensor]:
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
    tokens = gumbel_noise(seed, sample_ids, positions, logits.shape[-1]).add_(logp).argmax(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
