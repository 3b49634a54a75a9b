"""Numerical guards: a nan or inf never reaches the weights.

One non-finite reward, loss or gradient is enough to turn every weight into NaN after one
optimiser step, and everything after (checkpoints, metrics, the next rollouts) inherits it. The
trainer and the loop check before each step what the step would consume and apply the job's
`algorithm.on_nonfinite` policy: `fail` stops the run before any weight changes, naming the
sample and the value; `skip` leaves the offending sample (or, for a gradient that cannot be
pinned on one sample, the whole update) out and counts it in the step's metrics.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SKIP_HINT = "set algorithm.on_nonfinite: skip to leave such samples out instead"


def finite(value: float) -> bool:
    return math.isfinite(value)


def bad_rows(per_token: Tensor, mask: Tensor) -> list[int]:
    """Rows whose masked per-token values hold a nan or inf."""
    masked = torch.where(mask.bool(), per_token.detach(), torch.zeros_like(per_token.detach()))
    return torch.nonzero(~torch.isfinite(masked).all(dim=1)).flatten().tolist()


def first_bad_value(per_token: Tensor, mask: Tensor, row: int) -> float:
    values = per_token.detach()[row][mask[row].bool()]
    return float(values[~torch.isfinite(values)][0])


def weights_finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())
