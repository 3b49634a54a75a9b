"""Linear layers whose every row gets the same bits however many rows the product has.

The torch engine's passes are batch-invariant (transformer.py, cached_attention.py): a token's
logits do not depend on which other tokens share its pass. Its attention is our own kernel; its
projections are BLAS products, whose row results depend on the code path the library takes for the
matrix's row count. MKL in strict mode (rhymerl/__init__.py) keeps one path for every count on some
CPUs, but not on all: on an AMD EPYC with AVX-512 (this project's CI machine, MKL 2025 under torch
2.13) one row takes a matrix-vector path and two or three rows a small-matrix kernel, and only from
four rows on is every row's result the same (measured: 1 to 300 rows, shapes up to 576 x 49152).

So the path is measured, once per process and dtype: the fewest rows from which a product's rows
match those of a larger one, and a product with fewer rows is padded to that many. Padding a decode
pass of one sequence to four rows costs little: a pass that small reads the weights once either way.

The MLP's activation is the other row-dependent step. torch computes an elementwise function in
vectors of lanes, and the elements at the end of a range in scalar code, whose exp rounds otherwise
than the vector one; from GRAIN elements on, it splits the range between its threads at whatever
element divides it evenly. So with two threads, a pass of an odd number of rows (94 or more on the
embedded model) computed part of its middle row's SiLU in scalar code, and that token, and every
later one of its sequence, got other bits than in a pass of another size: a Ray run at off-policy 1
trained on behaviour log-probabilities that differed in their last bits from those of the same run
with other drafts (1 run in about 70 here, and once in CI). `silu_rows` runs the activation on row
blocks that one thread computes whole, vector lanes only where a row is a whole number of vector
steps wide.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

CANDIDATES = (1, 2, 4, 8, 16, 32)
"""Row counts tried as the threshold, smallest first; the last is used if none holds."""
_PROBE_ROWS = 64
_PROBE_SHAPES = ((96, 160), (160, 96))  # (in, out): both sides of a projection's aspect


@functools.cache
def invariant_rows(dtype: torch.dtype) -> int:
    """The fewest rows from which F.linear on this CPU gives each row the bits it has in any larger
    product (of the same weights), for `dtype`."""
    g = torch.Generator().manual_seed(0)
    probes = []
    for fan_in, fan_out in _PROBE_SHAPES:
        w = torch.randn(fan_out, fan_in, generator=g).to(dtype)
        x = torch.randn(_PROBE_ROWS, fan_in, generator=g).to(dtype)
        with torch.inference_mode():
            probes.append((w, x, F.linear(x, w)))
    for rows in CANDIDATES:
        counts = range(rows, _PROBE_ROWS)
        with torch.inference_mode():
            if all(torch.equal(F.linear(x[:n], w), full[:n]) for w, x, full in probes for n in counts):
                return rows
    return CANDIDATES[-1]


def padded_rows(fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """fn(x) for a row-wise `fn` (projections, an MLP, an output layer) on x [T, features], each row's
    result independent of T: fewer rows than `invariant_rows` are padded with zeros to that many."""
    rows = invariant_rows(x.dtype) if x.device.type == "cpu" else 1
    if x.shape[0] >= rows:
        return fn(x)
    return fn(torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])]))[: x.shape[0]]


GRAIN = 32768
"""torch's at::internal::GRAIN_SIZE: an elementwise op over fewer elements runs on one thread."""
VECTOR_STEP = 32
"""Elements per step of torch's vectorised elementwise loop at its widest (2 x 16 float lanes with
AVX-512): a row that is a whole number of steps wide is computed in vector code only, with any
narrower vectors (AVX2, NEON) too."""


def silu_rows(x: Tensor) -> Tensor:
    """F.silu of x [T, features], each row's bits independent of T (the module docstring): row blocks
    under GRAIN elements, one row per call where a row is not a whole number of vector steps (its
    scalar tail then falls on the same columns of every row). In place where x needs no gradient."""
    if x.device.type != "cpu":
        return F.silu(x)
    width = x.shape[-1]
    rows = max(1, (GRAIN - 1) // width) if width % VECTOR_STEP == 0 else 1
    if x.shape[0] <= rows:
        return F.silu(x, inplace=not x.requires_grad)
    if x.requires_grad:
        return torch.cat([F.silu(part) for part in x.split(rows)])
    for part in x.split(rows):
        F.silu(part, inplace=True)
    return x
