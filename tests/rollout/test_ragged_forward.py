"""A ragged block (per-row token counts) computes exactly what the dense block computes for its real tokens."""

from __future__ import annotations

import pytest
import torch

from rhymerl.workers.model.transformer import KVCache, TinyLlama


def _primed(model: TinyLlama, slots: int, prompt_len: int) -> tuple[KVCache, torch.Tensor]:
    cache = KVCache(model.cfg, slots, 64, torch.float64, torch.device("cpu"))
    prompts = torch.randint(3, model.cfg.vocab_size, (slots, prompt_len))
    model.prefill(prompts, torch.arange(slots), cache)
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
    rows = torch.tensor([0, 0, 1, 2, 1, 0])
    slots = torch.tensor([5, 0, 2, 1, 3, 4])
    shared = KVCache(tiny_model.cfg, 6, 32, torch.float32, torch.device("cpu"))
    each = KVCache(tiny_model.cfg, 6, 32, torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        once = tiny_model.prefill(prompts, slots, shared, rows)
        every = tiny_model.prefill(prompts[rows], slots, each)
    assert once.shape[0] == 3
    assert torch.equal(once[rows], every)
    assert torch.equal(shared.k, each.k) and torch.equal(shared.v, each.v)
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
