"""Typed front of the native cached-attention kernel (workers/model/native/cached_attention.cpp).

Verifying drafts appends W tokens per slot, and on CPU torch's attention then materialises a
[slots, heads, W, span] score block and walks it several times, so a verify pass costs about
twice a one-token pass. The kernel reads each slot's cache once for all of its W tokens, which
keeps verification close to the cost of plain decoding: the property that makes speculation pay
on a GPU, where decoding is bound by memory reads. `TinyLlama.forward_cached` (and `prefill`) run
every pass through it when `usable` says so (CPU, float32, head_dim a multiple of 16); `KVCache`
then stores keys transposed, [slots, heads, head_dim, max_len].

Every pass, because the kernel is batch-invariant: a token's arithmetic is its own query against
its own slot's keys in a fixed order, whatever else the pass holds, and MKL's strict mode
(rhymerl/__init__.py) gives the projections the same property. So a token gets the same bits
decoded alone, beside any batch-mates, inside a draft being verified or at the end of a prefill:
speculative decoding draws exactly the plain tokens with the same log-probabilities, and the
behaviour log-probabilities the trainer's importance correction reads do not depend on which
samples shared a pass (what made Ray runs at off-policy 1 differ in their last bits). torch's
one-token matmuls read up to the longest slot of the pass, which changed a row's rounding with
its batch-mates' lengths; through the kernel plain decoding costs 0.83-1.04x what they did on the
toy model and 0.88-1.02x on SmolLM2-135M (1 thread, 4-64 slots, interleaved medians; 2026-12-02).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from rhymerl.workers.model import _cached_attention as native

LANES = 16
"""Keys are scored 16 at a time: caches for the kernel round their length up to a multiple."""


def _torch_openmp() -> str | None:
    """Path of the OpenMP runtime torch loaded (Linux), so the kernel can share its threads; one
    shipped inside torch's own folder first, should another copy be loaded too."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split(maxsplit=5)[-1] for line in maps.splitlines()}
    found = sorted(p for p in paths if any(n in Path(p).name for n in ("libgomp", "libiomp", "libomp")))
    home = str(Path(torch.__file__).parent)
    return next((p for p in found if p.startswith(home)), found[0] if found else None)


NATIVE_FILE: str = native.__file__  # the built kernel (profile caches key on its bytes)
SHARED_THREADS = bool((library := _torch_openmp()) and native.use_openmp(library))
"""Whether parallel regions run on torch's OpenMP workers (else on threads of the kernel's own)."""


SWITCH = "RHYMERL_NATIVE_ATTENTION"
"""Set to 0 to run torch's attention instead (for comparisons)."""


def usable(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """CPU, float32, head_dim a multiple of 16, and not switched off by SWITCH=0."""
    return (device.type == "cpu" and dtype == torch.float32 and head_dim % LANES == 0
            and os.environ.get(SWITCH, "1") != "0")


def attend(q: Tensor, k_new: Tensor, v_new: Tensor, keys: Tensor, values: Tensor, start: Tensor,
           counts: Tensor) -> Tensor:
    """Store a ragged block's keys and values in their slots' caches; return its attention.

    q [T, heads, dim] and k_new, v_new [T, kv_heads, dim]: the block's tokens slot by slot, counts[s]
    of them for slot s, at positions start[s] .. start[s] + counts[s] - 1; keys [S, kv_heads, dim,
    max_len] and values [S, kv_heads, max_len, dim] are the caches of slots 0..S-1 (grouped-query
    attention: heads is a multiple of kv_heads, query head h reads key/value head h // (heads /
    kv_heads)). Each token attends to its slot's positions up to its own. Returns [T, heads, dim].
    """
    slots, kv_heads, dim, max_len = keys.shape
    heads = q.shape[1]
    if any(t.dtype != torch.float32 for t in (q, k_new, v_new, keys, values)):
        raise TypeError("cached attention: float32 tensors only")
    if (q.dim() != 3 or q.shape[2] != dim or heads % kv_heads or k_new.shape != (q.shape[0], kv_heads, dim)
            or v_new.shape != k_new.shape or values.shape != (slots, kv_heads, max_len, dim)):
        raise ValueError(f"cached attention: q {tuple(q.shape)}, new keys {tuple(k_new.shape)}, new values "
                         f"{tuple(v_new.shape)}, keys {tuple(keys.shape)} and values {tuple(values.shape)} disagree")
    if keys.stride(-1) != 1 or values.stride(-1) != 1:
        raise ValueError("cached attention: keys and values need a unit stride in their last dimension")
    q, k_new, v_new = q.contiguous(), k_new.contiguous(), v_new.contiguous()
    start = start.to(torch.int64).contiguous()
    counts = counts.to(torch.int64).contiguous()
    if start.shape != (slots,) or counts.shape != (slots,):
        raise ValueError(f"cached attention: start and counts need one entry per slot ({slots})")
    ends = torch.cumsum(counts, 0)
    if q.shape[0] != (int(ends[-1]) if slots else 0):
        raise ValueError(f"cached attention: {q.shape[0]} queries for {int(counts.sum())} counted tokens")
    offsets = ends - counts
    out = torch.empty_like(q)
    ks, vs = keys.stride(), values.stride()
    native.attend(q.data_ptr(), k_new.data_ptr(), v_new.data_ptr(), keys.data_ptr(), values.data_ptr(),
                  out.data_ptr(), start.data_ptr(), counts.data_ptr(), offsets.data_ptr(), slots, heads, kv_heads,
                  dim, max_len, ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], dim**-0.5, torch.get_num_threads())
    return out
