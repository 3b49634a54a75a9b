"""A ragged block (per-row token counts) computes exactly what the dense block computes for its real tokens."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.workers.model.folder import ModelConfig
from rhymerl.workers.model.transformer import KVCache, TinyLlama


def _primed(model: TinyLlama, slots: int, prompt_len: int) -> tuple[KVCache, torch.Tensor]:
    cache = KVCache(model.cfg, slots, 64, torch.float64, torch.device("cpu"))
    prompts = torch.randint(3, model.cfg.vocab_size, (slots, prompt_len))
    model.prefill(prompts, torch.full((slots,), prompt_len), torch.arange(slots), cache)
    return cache, torch.full((slots,), prompt_len)


def test_ragged_logits_equal_dense_logits_on_real_tokens_and_zero_on_padding(tiny_model: TinyLlama) -> None:
    model = tiny_model.double()
    torch.manual_seed(1)
    cache_dense, start = _primed(model, 4, 6)
    cache_ragged = KVCache(model.cfg, 4, 64, torch.float64, torch.device("cpu"))
    cache_ragged.k.copy_(cache_dense.k)
    cache_ragged.v.copy_(cache_dense.v)
    block = torch.randint(3, model.cfg.vocab_size, (4, 5))
    counts = torch.tensor([5, 1, 3, 0])
    with torch.inference_mode():
        dense = model.forward_cached(block, start, cache_dense)
        ragged = model.forward_cached(block, start, cache_ragged, counts)
    for row, n in enumerate(counts.tolist()):
        torch.testing.assert_close(ragged[row, :n], dense[row, :n], rtol=0, atol=1e-12)
        assert torch.count_nonzero(ragged[row, n:]) == 0
        # keys and values are cached for the real tokens only
        torch.testing.assert_close(cache_ragged.k[:, row, :, : 6 + n], cache_dense.k[:, row, :, : 6 + n])
        assert torch.count_nonzero(cache_ragged.k[:, row, :, 6 + n: 6 + 5]) == 0


def test_a_token_gets_the_same_logits_alone_or_inside_a_longer_block(tiny_model: TinyLlama) -> None:
    model = tiny_model.double()
    torch.manual_seed(2)
    cache, start = _primed(model, 3, 4)
    block = torch.randint(3, model.cfg.vocab_size, (3, 4))
    with torch.inference_mode():
        one = model.forward_cached(block, start, cache, torch.tensor([1, 1, 1]))
        four = model.forward_cached(block, start, cache, torch.tensor([4, 2, 1]))
    torch.testing.assert_close(four[:, 0], one[:, 0], rtol=0, atol=1e-12)


def test_a_prompt_scored_once_for_several_slots_fills_their_caches_as_scoring_each_would(
        tiny_model: TinyLlama) -> None:
    torch.manual_seed(3)
    prompts = torch.randint(3, tiny_model.cfg.vocab_size, (3, 9))
    prompts[1, 6:] = 0  # right padding of a shorter prompt
    lengths = torch.tensor([9, 6, 9])
    rows = torch.tensor([0, 0, 1, 2, 1, 0])
    slots = torch.tensor([5, 0, 2, 1, 3, 4])
    shared = KVCache(tiny_model.cfg, 6, 32, torch.float32, torch.device("cpu"))
    each = KVCache(tiny_model.cfg, 6, 32, torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        once = tiny_model.prefill(prompts, lengths, slots, shared, rows)
        every = tiny_model.prefill(prompts[rows], lengths[rows], slots, each)
    assert once.shape == (3, tiny_model.cfg.vocab_size)
    assert torch.equal(once[rows], every)
    for slot, row in zip(slots.tolist(), rows.tolist(), strict=True):  # what is past a slot's length is never read
        n = int(lengths[row])
        assert torch.equal(shared.k[:, slot, :, :, :n], each.k[:, slot, :, :, :n])
        assert torch.equal(shared.v[:, slot, :, :n], each.v[:, slot, :, :n])
    assert torch.count_nonzero(shared.v[:, slots]) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_moving_slots_copies_their_cached_positions(tiny_model: TinyLlama, dtype: torch.dtype) -> None:
    model = tiny_model.to(dtype)
    cache = KVCache(model.cfg, 4, 32, dtype, torch.device("cpu"))
    torch.manual_seed(4)
    cache.k.normal_()
    cache.v.normal_()
    before_k = [cache.keys(layer, 4, 10).clone() for layer in range(model.cfg.num_hidden_layers)]
    before_v = cache.v[:, :, :, :10].clone()
    cache.move(torch.tensor([2, 3]), torch.tensor([0, 1]), 10)
    for layer, keys in enumerate(before_k):
        assert torch.equal(cache.keys(layer, 2, 10), keys[2:4])
    assert torch.equal(cache.v[:, :2, :, :10], before_v[:, 2:4])


@functools.cache
def _grouped_model() -> TinyLlama:
    """float32, head_dim 16 (the native kernel's), two query heads per key/value head."""
    torch.manual_seed(5)
    cfg = ModelConfig(vocab_size=40, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=96, max_position_embeddings=256)
    return TinyLlama(cfg).eval()


@settings(max_examples=25, deadline=None)
@given(prefix=st.integers(1, 40), width=st.integers(1, 6), mates=st.lists(st.integers(1, 70), max_size=3),
       seed=st.integers(0, 2**16))
def test_a_tokens_logits_have_the_same_bits_however_its_pass_is_made_up(
        prefix: int, width: int, mates: list[int], seed: int) -> None:
    """Batch invariance (float32, the native kernel): the logits of the token at position `prefix`
    are the same bits whether its sequence is prefilled up to it, decoded one token after a prefill,
    or verified inside a draft of `width` tokens, alone or beside slots of other lengths. So
    speculative and plain decoding draw the same tokens with the same log-probabilities, and a
    sample's behaviour log-probabilities do not depend on its batch-mates."""
    model = _grouped_model()
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(3, model.cfg.vocab_size, (1, prefix + width), generator=g)
    others = [torch.randint(3, model.cfg.vocab_size, (1, n + width), generator=g) for n in mates]

    def logits_at(known: int, block: int, with_mates: bool) -> torch.Tensor:
        """Prefill `known` tokens, then pass `block` more; the logits of position `prefix`."""
        rows = [seq] + (others if with_mates else [])
        cache = KVCache(model.cfg, len(rows), 128, torch.float32, torch.device("cpu"))
        assert cache.native
        starts = [known] + [o.shape[1] - width for o in rows[1:]]
        padded = torch.zeros(len(rows), max(starts), dtype=torch.int64)
        for i, (r, n) in enumerate(zip(rows, starts, strict=True)):
            padded[i, :n] = r[0, :n]
        with torch.inference_mode():
            last = model.prefill(padded, torch.tensor(starts), torch.arange(len(rows)), cache)
            if block == 0:
                return last[0]
            tokens = torch.stack([r[0, n: n + block] for r, n in zip(rows, starts, strict=True)])
            return model.forward_cached(tokens, torch.tensor(starts), cache)[0, prefix - known]

    reference = logits_at(prefix + 1, 0, False)  # the last of a prefill
    assert torch.equal(logits_at(prefix, 1, False), reference)  # one-token decoding
    assert torch.equal(logits_at(prefix, 1, True), reference)  # beside other slots
    assert torch.equal(logits_at(max(1, prefix + 1 - width), width, True), reference)  # inside a verify block
