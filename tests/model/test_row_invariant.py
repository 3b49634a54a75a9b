"""A projection's rows, and the MLP's activation, get the same bits whatever the row count
(workers/model/row_invariant.py): the torch engine's batch invariance rests on them on every CPU,
whichever BLAS path a few rows take and however torch splits an elementwise op between threads."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rhymerl.workers.model.row_invariant import CANDIDATES, invariant_rows, padded_rows, silu_rows
from rhymerl.workers.model.transformer import KVCache, ModelConfig, TinyLlama


def test_the_measured_threshold_is_one_of_the_candidates() -> None:
    assert invariant_rows(torch.float32) in CANDIDATES


def test_every_row_count_gives_each_row_the_bits_it_has_in_a_large_product() -> None:
    torch.manual_seed(0)
    for fan_in, fan_out in ((32, 64), (576, 1536), (1536, 576)):
        layer = nn.Linear(fan_in, fan_out, bias=False)
        x = torch.randn(300, fan_in)
        with torch.inference_mode():
            full = padded_rows(layer, x)
            for n in [*range(1, 18), 33, 100]:
                assert torch.equal(padded_rows(layer, x[:n]), full[:n]), (fan_in, fan_out, n)
                assert torch.equal(padded_rows(layer, x[n: n + 1]), full[n: n + 1])  # a row alone, anywhere


@contextmanager
def two_threads() -> Iterator[None]:
    """torch at 2 threads inside (what splits an elementwise op's range between threads); the tests
    take the `settable_threads` fixture, so a vLLM test earlier in the process cannot make it a no-op."""
    was = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(was)


@pytest.mark.parametrize("width", [352, 1536, 100])  # the embedded model's MLP, SmolLM2's, one no vector step divides
@pytest.mark.usefixtures("settable_threads")
def test_silu_gives_each_row_the_bits_it_has_in_a_larger_block_at_two_threads(width: int) -> None:
    x = torch.randn(400, width, generator=torch.Generator().manual_seed(width)) * 3
    with two_threads(), torch.inference_mode():
        full = silu_rows(x.clone())
        torch.testing.assert_close(full, F.silu(x), rtol=1e-6, atol=0)  # SiLU, computed in other blocks
        differ = [n for n in range(1, 400) if not torch.equal(silu_rows(x[:n].clone()), full[:n])]
    assert differ == []


@pytest.mark.usefixtures("settable_threads")
def test_a_pass_of_many_tokens_gives_each_the_logits_it_gets_in_two_smaller_passes() -> None:
    """Odd token counts over torch's grain in one pass (before silu_rows, part of the middle token's
    SiLU ran in scalar code at 2 threads) and the same tokens as two passes."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                      intermediate_size=352, max_position_embeddings=256)
    model = TinyLlama(cfg).eval()
    tokens = torch.randint(3, 40, (1, 111), generator=torch.Generator().manual_seed(1))
    with two_threads(), torch.inference_mode():
        for n in (95, 99, 101, 105, 111):
            logits = []
            for cuts in ([0, n], [0, n // 2, n]):
                cache = KVCache(cfg, 1, 128, torch.float32, torch.device("cpu"))
                assert cache.native
                logits.append(torch.cat([model.forward_cached(tokens[:, a:b], torch.tensor([a]), cache)[0]
                                         for a, b in itertools.pairwise(cuts)]))
            assert torch.equal(logits[0], logits[1]), n
