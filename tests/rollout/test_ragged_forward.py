"""A ragged block (per-row token counts) computes exactly what the dense block computes for its real tokens."""

from __future__ import annotations

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
