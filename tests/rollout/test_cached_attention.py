"""The native cached-attention kernel computes causal attention over each slot's own prefix (a
group's query heads over their shared key/value head, for grouped-query attention), the same bits
for a token whatever block it is verified in and however many threads run it, and the model agrees
with torch's path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.workers.model import cached_attention
from rhymerl.workers.model.transformer import KVCache, TinyLlama


def _cache(slots: int, heads: int, dim: int, max_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(slots, heads, dim, max_len, generator=gen)
    values = torch.randn(slots, heads, max_len, dim, generator=gen)
    return keys, values


def _reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: list[int],
               counts: list[int]) -> torch.Tensor:
    """Token by token, in float64: softmax(q . k / sqrt(d)) . v over positions 0..own position, query
    head h reading key/value head h // (heads / kv_heads)."""
    out, cell = [], 0
    dim = q.shape[-1]
    group = q.shape[1] // keys.shape[1]
    for s, (p0, n) in enumerate(zip(start, counts, strict=True)):
        for w in range(n):
            k = keys[s, :, :, : p0 + w + 1].double().repeat_interleave(group, 0)  # [heads, dim, keys]
            v = values[s, :, : p0 + w + 1].double().repeat_interleave(group, 0)   # [heads, keys, dim]
            scores = torch.einsum("hd,hdj->hj", q[cell].double(), k) / dim**0.5
            out.append(torch.einsum("hj,hjd->hd", torch.softmax(scores, -1), v))
            cell += 1
    return torch.stack(out).float() if out else q.new_zeros(0, *q.shape[1:])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), st.sampled_from([16, 32]), st.data())
def test_kernel_matches_a_per_token_softmax_over_the_slots_prefix(slots: int, kv_heads: int, group: int, dim: int,
                                                                  data: st.DataObject) -> None:
    start = data.draw(st.lists(st.integers(0, 40), min_size=slots, max_size=slots))
    counts = data.draw(st.lists(st.integers(0, 9), min_size=slots, max_size=slots))
    keys, values = _cache(slots, kv_heads, dim, 64, seed=sum(start) + 7 * sum(counts))
    q = torch.randn(sum(counts), kv_heads * group, dim, generator=torch.Generator().manual_seed(3))
    k_new, v_new = torch.randn(2, sum(counts), kv_heads, dim, generator=torch.Generator().manual_seed(4))
    got = cached_attention.attend(q, k_new, v_new, keys, values, torch.tensor(start), torch.tensor(counts))
    cell = 0
    for s, (p0, n) in enumerate(zip(start, counts, strict=True)):  # the block was stored first
        assert torch.equal(keys[s, :, :, p0: p0 + n], k_new[cell: cell + n].permute(1, 2, 0))
        assert torch.equal(values[s, :, p0: p0 + n], v_new[cell: cell + n].transpose(0, 1))
        cell += n
    torch.testing.assert_close(got, _reference(q, keys, values, start, counts), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [1, 3])
def test_a_token_gets_the_same_bits_alone_or_inside_a_verify_block(group: int) -> None:
    keys, values = _cache(3, 2, 32, 128, seed=0)
    start = torch.tensor([50, 0, 97])
    q = torch.randn(3 * 9, 2 * group, 32, generator=torch.Generator().manual_seed(1))
    k_new, v_new = torch.randn(2, 3 * 9, 2, 32, generator=torch.Generator().manual_seed(2))
    block = cached_attention.attend(q, k_new, v_new, keys, values, start, torch.tensor([9, 9, 9]))
    for w in range(9):  # token w of every slot, decoded as the only token of its pass
        alone = cached_attention.attend(q[w::9], k_new[w::9], v_new[w::9], keys, values, start + w,
                                        torch.tensor([1, 1, 1]))
        assert torch.equal(alone, block[w::9])


def test_a_call_big_enough_for_threads_matches_the_reference_and_the_single_threaded_bits() -> None:
    # 8 slots x ~1,000 keys x 5 queries x 2 heads: past the kernel's threshold for a second thread
    keys, values = _cache(8, 2, 32, 1024, seed=5)
    start, counts = [1000 - 7 * s for s in range(8)], [5] * 8
    q, k_new, v_new = torch.randn(3, 40, 2, 32, generator=torch.Generator().manual_seed(6))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = cached_attention.attend(q, k_new, v_new, keys, values, torch.tensor(start), torch.tensor(counts))
        torch.set_num_threads(1)
        one = cached_attention.attend(q, k_new, v_new, keys, values, torch.tensor(start), torch.tensor(counts))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    torch.testing.assert_close(two, _reference(q, keys, values, start, counts), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.backends.openmp.is_available(), reason="torch built without OpenMP")
def test_the_kernel_runs_on_torchs_own_openmp_threads() -> None:
    assert cached_attention.SHARED_THREADS


def test_positions_beyond_the_cache_and_miscounted_queries_are_refused() -> None:
    keys, values = _cache(2, 1, 16, 32, seed=0)
    q, q4 = torch.randn(3, 1, 16), torch.randn(4, 1, 16)
    cached_attention.attend(q, q, q, keys, values, torch.tensor([0, 30]), torch.tensor([1, 2]))  # 30..31 fit
    with pytest.raises(IndexError, match=r"slot 1: positions 30\.\.32 do not fit a cache of 32"):
        cached_attention.attend(q4, q4, q4, keys, values, torch.tensor([0, 30]), torch.tensor([1, 3]))
    with pytest.raises(ValueError, match="3 queries for 2 counted tokens"):
        cached_attention.attend(q, q, q, keys, values, torch.tensor([0, 0]), torch.tensor([1, 1]))


def test_the_model_computes_the_same_logits_with_the_kernel_and_with_torch_attention(
        tiny_model: TinyLlama, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model.float()
    torch.manual_seed(4)
    prompts = torch.randint(3, model.cfg.vocab_size, (3, 7))
    block = torch.randint(3, model.cfg.vocab_size, (3, 5))
    counts = torch.tensor([5, 2, 0])
    logits = {}
    for native in (True, False):
        monkeypatch.setattr(cached_attention, "usable", lambda *_, native=native: native)
        cache = KVCache(model.cfg, 3, 40, torch.float32, torch.device("cpu"))
        assert cache.native is native
        with torch.inference_mode():
            model.prefill(prompts, torch.full((3,), 7), torch.arange(3), cache)
            logits[native] = model.forward_cached(block, torch.full((3,), 7), cache, counts)
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-5, atol=1e-5)
