"""A projection's rows get the same bits whatever the product's row count (workers/model/row_invariant.py):
the torch engine's batch invariance rests on it on every CPU, whichever BLAS path a few rows take."""

from __future__ import annotations

import torch
from torch import nn

from rhymerl.workers.model.row_invariant import CANDIDATES, invariant_rows, padded_rows


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
