"""Measure the verify-cost profile t(batch, tokens per sequence) of a model on this machine, cached.

The adaptive speculation policy needs to know what appending 1 + k tokens per sequence costs at
each batch size. That depends on the model, the device, the dtype and the torch build, so it is
measured once at start-up (a few seconds for the embedded model) and cached under
``$RHYMERL_CACHE`` (default ``~/.cache/rhymerl``), keyed by all four and by the model code.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from rhymerl.workers.model import cached_attention
from rhymerl.workers.model.transformer import KVCache, TinyLlama
from rhymerl.workers.rollout.adaptive import CostProfile

BATCHES = (1, 4, 16, 64, 128, 256)
TOKENS = (1, 2, 3, 5, 9, 17, 33)


def cache_dir() -> Path:
    return Path(os.environ.get("RHYMERL_CACHE", Path.home() / ".cache" / "rhymerl")) / "profiles"


def profile_key(model: TinyLlama, context: int, batches: tuple[int, ...], tokens: tuple[int, ...]) -> str:
    param = next(model.parameters())
    # the forward pass's own code (and its native attention kernel) is part of the key: a changed
    # implementation costs differently; so is this file, which decides what is measured
    code = hashlib.sha256(b"".join(Path(f).read_bytes() for f in (inspect.getfile(TinyLlama), __file__,
                                                                   cached_attention.native.__file__))).hexdigest()
    parts = [model.cfg.to_json(), str(param.device), str(param.dtype), torch.__version__,
             str(torch.get_num_threads()), str(context), str(batches), str(tokens), code,
             str(cached_attention.usable(param.device, param.dtype, model.cfg.head_dim))]
    if param.device.type == "cuda":
        parts.append(torch.cuda.get_device_name(param.device))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def monotone(grid: list[list[float]]) -> tuple[tuple[float, ...], ...]:
    """Running maximum along both axes: appending more tokens, or to more sequences, never costs less.

    A timing disturbed by other work on the machine then cannot make a bigger pass look cheaper.
    """
    out = [list(row) for row in grid]
    for i, row in enumerate(out):
        for j in range(len(row)):
            if j:
                row[j] = max(row[j], row[j - 1])
            if i:
                row[j] = max(row[j], out[i - 1][j])
    return tuple(tuple(r) for r in out)


def _timer(model: TinyLlama, repeats: int) -> Callable[..., float]:
    """Fastest of `repeats` timings of fn(*args) after one warm-up (interference only ever adds time)."""
    param = next(model.parameters())
    sync = torch.cuda.synchronize if param.device.type == "cuda" else (lambda: None)

    def fastest(fn: Callable[..., object], *args: object) -> float:
        fn(*args)
        sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(*args)
            sync()
            times.append(time.perf_counter() - t0)
        return min(times)

    return fastest


@torch.inference_mode()
def measure(model: TinyLlama, context: int = 256, batches: tuple[int, ...] = BATCHES,
            tokens: tuple[int, ...] = TOKENS, repeats: int = 5) -> CostProfile:
    """Seconds of one forward_cached pass per (batch, tokens) at `context` tokens of cache, and
    per batch of a verify pass carrying one token per sequence (CostProfile.verify_one).

    Each cell is the fastest of `repeats` timings, then the grid is made monotone.
    """
    param = next(model.parameters())
    fastest = _timer(model, repeats)
    grid, verify_one = [], []
    for b in batches:
        cache = KVCache(model.cfg, b, context + max(tokens), param.dtype, param.device)
        start = torch.full((b,), context, dtype=torch.int64, device=param.device)
        row = []
        for t in tokens:
            ids = torch.randint(3, model.cfg.vocab_size, (b, t), device=param.device)
            row.append(fastest(model.forward_cached, ids, start, cache))
        grid.append(row)
        # a block two tokens wide with one real token per row: the verify path at its cheapest
        ones = torch.ones(b, dtype=torch.int64, device=param.device)
        pair = torch.randint(3, model.cfg.vocab_size, (b, 2), device=param.device)
        verify_one.append(fastest(model.forward_cached, pair, start, cache, ones))
    column = monotone([[v] for v in verify_one])
    return CostProfile(tuple(batches), tuple(tokens), monotone(grid), tuple(r[0] for r in column))


@torch.inference_mode()
def measure_decode_grid(model: TinyLlama, batches: Sequence[int], contexts: Sequence[int], rounds: int = 10,
                        progress: Callable[[], None] = lambda: None) -> tuple[tuple[float, ...], ...]:
    """Seconds of one plain decode pass (one token per sequence) per (batch, context): the
    scheduling simulator's iteration profile.

    The grid is swept `rounds` times and each cell keeps its fastest timing, so a burst of
    interference on a shared machine spoils one visit of a cell, not the cell; then the grid is
    made monotone (more sequences or more context never cost less). `progress` is called after
    each cell visit.
    """
    param = next(model.parameters())
    fastest = _timer(model, 2)
    best = [[float("inf")] * len(contexts) for _ in batches]
    for _ in range(rounds):
        for i, b in enumerate(batches):
            for j, c in enumerate(contexts):
                cache = KVCache(model.cfg, b, c + 1, param.dtype, param.device)
                start = torch.full((b,), c, dtype=torch.int64, device=param.device)
                ids = torch.randint(3, model.cfg.vocab_size, (b, 1), device=param.device)
                best[i][j] = min(best[i][j], fastest(model.forward_cached, ids, start, cache))
                progress()
    return monotone(best)


@torch.inference_mode()
def measure_prefill(model: TinyLlama, tokens: int, repeats: int = 5) -> float:
    """Seconds per token of the engine's prefill of one `tokens`-token prompt (what a migrated
    sample's KV recompute costs)."""
    param = next(model.parameters())
    cache = KVCache(model.cfg, 1, tokens, param.dtype, param.device)
    ids = torch.randint(3, model.cfg.vocab_size, (1, tokens), device=param.device)
    slots = torch.zeros(1, dtype=torch.int64, device=param.device)
    return _timer(model, repeats)(model.prefill, ids, slots, cache) / tokens


def load_or_measure(model: TinyLlama, context: int = 256, batches: tuple[int, ...] = BATCHES,
                    tokens: tuple[int, ...] = TOKENS) -> CostProfile:
    path = cache_dir() / f"{profile_key(model, context, batches, tokens)}.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            return CostProfile(tuple(data["batch_sizes"]), tuple(data["tokens"]),
                               tuple(tuple(r) for r in data["seconds"]), tuple(data["verify_one"]))
        except (ValueError, KeyError, TypeError):
            path.unlink()  # a damaged cache entry is re-measured, never trusted
    prof = measure(model, context, batches, tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"batch_sizes": prof.batch_sizes, "tokens": prof.tokens,
                               "seconds": prof.seconds, "verify_one": prof.verify_one, "context": context}))
    tmp.replace(path)
    return prof
