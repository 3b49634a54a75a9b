"""Measure the verify-cost profile t(batch, tokens per sequence) of a model on this machine, cached,
re-measured where it went stale or was shown wrong, and corrected by the passes it priced.

The adaptive speculation policy needs to know what appending 1 + k tokens per sequence costs at
each batch size. That depends on the model, the device, the dtype, the torch build and its thread
count, so it is measured on first use (seconds for the embedded model, minutes for a bigger
one; `progress` reports each cell) and cached under ``$RHYMERL_CACHE`` (default
``~/.cache/rhymerl``), keyed by all of these and by the model code.

A real model's full grid takes minutes to time (SmolLM2-135M on 2 CPU cores: about 75 s for batches up
to 64), so a first run times its cheapest cells within FIRST_BUDGET_S and starts with an upper bound
for the rest (estimated_bounds: a pass of more tokens never costs less per token than the cheaper
pass it is scaled from), marked due; each rollout step's update then times due cells within
STEP_BUDGET_S, cheapest first, so the profile is complete after a few steps and no step waits long.

A timing taken while the machine was busy comes out too slow, and a cache keeps it. So the cache
holds, per cell, what was measured and when, and the smallest bound real passes put on it
(adaptive.CostEvidence, merged after every rollout step by ProfileStore.update). The profile a
run uses is, per cell, the smaller of the two. A cell is re-measured (ProfileStore.due) when its
measurement is older than MAX_AGE_S, when passes seen after it ran in under INCONSISTENT of it
(a pass, overheads included, cannot be faster than its forward pass: the measurement was
disturbed), and, when most cells with such evidence were disturbed, every cell measured back
then (the whole measurement is suspect, also where no pass could show it). That happens at start-up
and between rollout steps (each cell at most once per run, so a machine that stays busy cannot
make a run measure forever); writes are atomic.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from rhymerl.algorithms.drafting.adaptive_cap import INCONSISTENT, CostEvidence, CostProfile, cells_profile
from rhymerl.errors import user_paths
from rhymerl.workers import atomic
from rhymerl.workers.cache import cache_root
from rhymerl.workers.model import cached_attention
from rhymerl.workers.model.transformer import KVCache, TinyLlama

BATCHES = (1, 4, 16, 64, 128, 256)
TOKENS = (1, 2, 3, 5, 9, 17, 33)


def cache_dir() -> Path:
    return cache_root() / "profiles"


def profile_key(model: TinyLlama, context: int, batches: tuple[int, ...], tokens: tuple[int, ...]) -> str:
    param = next(model.parameters())
    # the forward pass's own code (and its native attention kernel) is part of the key: a changed
    # implementation costs differently; so is this file, which decides what is measured
    code = hashlib.sha256(b"".join(Path(f).read_bytes() for f in (inspect.getfile(TinyLlama), __file__,
                                                                   cached_attention.NATIVE_FILE))).hexdigest()
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
    def sync() -> None:
        if param.device.type == "cuda":
            torch.cuda.synchronize()

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


Progress = Callable[[int, int], None]
"""progress(done, total): (0, total) before the first of `total` cells is measured and (k, total)
after the k-th, ending with (k, k) where the budget left the other cells to later steps; (0, 0) once
when nothing needed measuring (the cached profile was used as is)."""

Cell = tuple[int, int]
"""(batch index, tokens index); the tokens index len(tokens) is the verify column (verify_one)."""


def cell_tokens(tokens: Sequence[int], j: int) -> int:
    """Tokens per sequence a cell's pass computes (the verify column's block is two wide)."""
    return tokens[j] if j < len(tokens) else 2


@torch.inference_mode()
def measure_cells(model: TinyLlama, context: int, batches: Sequence[int], tokens: Sequence[int],
                  cells: Iterable[Cell], repeats: int = 5, progress: Progress | None = None,
                  budget_s: float = math.inf) -> dict[Cell, float]:
    """Seconds of one forward_cached pass for each of `cells`, at `context` tokens of cache: the
    fastest of `repeats` timings. The verify column is a verify pass carrying one token per
    sequence (a block two tokens wide with one real token per row: the verify path at its cheapest).

    Cells are timed cheapest first (by batch x tokens); once `budget_s` has passed no further cell
    starts (the first always does), and the cells left out are not in the result.
    Token ids come from a private generator: measuring never moves torch's global random state.
    """
    todo = sorted(set(cells), key=lambda c: (batches[c[0]] * cell_tokens(tokens, c[1]), c))
    param = next(model.parameters())
    fastest = _timer(model, repeats)
    gen = torch.Generator(device=param.device).manual_seed(0)
    out: dict[Cell, float] = {}
    if progress is not None and todo:
        progress(0, len(todo))
    began = time.perf_counter()
    caches: dict[int, KVCache] = {}
    for i, j in todo:
        if out and time.perf_counter() - began > budget_s:
            break
        b = batches[i]
        cache = caches.setdefault(i, KVCache(model.cfg, b, context + max(tokens), param.dtype, param.device))
        start = torch.full((b,), context, dtype=torch.int64, device=param.device)
        ids = torch.randint(3, model.cfg.vocab_size, (b, cell_tokens(tokens, j)), device=param.device, generator=gen)
        if j < len(tokens):
            out[(i, j)] = fastest(model.forward_cached, ids, start, cache)
        else:
            ones = torch.ones(b, dtype=torch.int64, device=param.device)
            out[(i, j)] = fastest(model.forward_cached, ids, start, cache, ones)
        caches = {i: caches[i]}  # one batch size's cache at a time
        if progress is not None:
            progress(len(out), len(todo))
    if progress is not None and todo and len(out) < len(todo):
        progress(len(out), len(out))  # the budget ended it: the rest start as estimates (estimated_bounds)
    return out


def estimated_bounds(batches: Sequence[int], tokens: Sequence[int], timed: Mapping[Cell, float]) -> dict[Cell, float]:
    """An upper bound for every cell `timed` lacks: the least of the timed cells with no more sequences
    and tokens, scaled by the ratio of their batch x tokens. A pass's cost is a fixed part plus parts
    that grow with its sequences and tokens, so it never costs less per token than a smaller pass."""
    cells = [(i, j) for i in range(len(batches)) for j in range(len(tokens) + 1)]
    size = {c: batches[c[0]] * cell_tokens(tokens, c[1]) for c in cells}
    out = {}
    for c in cells:
        if c in timed:
            continue
        below = [seconds * size[c] / size[d] for d, seconds in timed.items()
                 if batches[d[0]] <= batches[c[0]] and cell_tokens(tokens, d[1]) <= cell_tokens(tokens, c[1])]
        if not below:
            raise ValueError(f"no timed cell is smaller than batch {batches[c[0]]} x {cell_tokens(tokens, c[1])} tokens")
        out[c] = min(below)
    return out


def measure(model: TinyLlama, context: int = 256, batches: tuple[int, ...] = BATCHES,
            tokens: tuple[int, ...] = TOKENS, repeats: int = 5, progress: Progress | None = None) -> CostProfile:
    """Seconds of one forward_cached pass per (batch, tokens) at `context` tokens of cache, and
    per batch of a verify pass carrying one token per sequence (CostProfile.verify_one).

    Each cell is the fastest of `repeats` timings, then the grid is made monotone.
    """
    every = [(i, j) for i in range(len(batches)) for j in range(len(tokens) + 1)]
    timed = measure_cells(model, context, batches, tokens, every, repeats, progress)
    return CacheEntry.measured_now(tuple(batches), tuple(tokens), context, timed, time.time()).profile()


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
    lengths = torch.full((1,), tokens, dtype=torch.int64, device=param.device)
    return _timer(model, repeats)(model.prefill, ids, lengths, slots, cache) / tokens


MAX_AGE_S = 7 * 24 * 3600.0
"""A measurement older than this is taken again: the machine (its load, kernel, clocks) moves on."""
FIRST_BUDGET_S = 30.0
"""A first run's measurement starts no cell after this many seconds (the rest start as estimates)."""
STEP_BUDGET_S = 10.0
"""An update after a rollout step starts no re-measurement after this many seconds."""


def _grid(rows: Any, shape: tuple[int, int], missing: float) -> NDArray[np.float64]:
    out = np.array([[missing if v is None else float(v) for v in row] for row in rows], dtype=np.float64)
    if out.shape != shape:
        raise ValueError(f"expected a {shape[0]} x {shape[1]} grid, got {out.shape}")
    return out


def _json_grid(grid: NDArray[np.float64]) -> list[list[float | None]]:
    return [[float(v) if math.isfinite(v) else None for v in row] for row in grid.tolist()]


@dataclass
class CacheEntry:
    """One cached profile. Per cell (batch x tokens, then the verify column): the raw measured
    seconds and when they were taken, and the smallest bound real passes put on the cell and when
    (inf and -inf where there is none)."""

    batch_sizes: tuple[int, ...]
    tokens: tuple[int, ...]
    context: int
    measured: NDArray[np.float64]
    measured_at: NDArray[np.float64]
    observed: NDArray[np.float64]
    observed_at: NDArray[np.float64]

    @classmethod
    def measured_now(cls, batch_sizes: tuple[int, ...], tokens: tuple[int, ...], context: int,
                     timed: dict[Cell, float], now: float) -> CacheEntry:
        """An entry of the `timed` cells; any cell left out starts as an estimate (estimated_bounds),
        measured at time 0, so due at once."""
        shape = (len(batch_sizes), len(tokens) + 1)
        if not timed:
            raise ValueError("a new profile needs a measured cell")
        entry = cls(batch_sizes, tokens, context, np.zeros(shape), np.zeros(shape), np.full(shape, np.inf),
                    np.full(shape, -np.inf))
        entry.remeasured(estimated_bounds(batch_sizes, tokens, timed), 0.0)
        entry.remeasured(timed, now)
        return entry

    def profile(self) -> CostProfile:
        """Per cell the smaller of the measurement (made monotone, as one disturbed timing must not
        make a bigger pass look cheaper) and the observed bound."""
        grid = np.asarray(monotone(self.measured[:, :-1].tolist()))
        verify = np.asarray(monotone([[v] for v in self.measured[:, -1].tolist()]))
        cells = np.minimum(np.column_stack([grid, verify]), self.observed)
        like = CostProfile(self.batch_sizes, self.tokens, tuple(tuple(r) for r in grid.tolist()),
                           tuple(verify[:, 0].tolist()))
        return cells_profile(like, cells)

    def due(self, now: float, max_age_s: float = MAX_AGE_S) -> list[Cell]:
        """Cells to measure again: too old, shown disturbed by passes seen after their measurement,
        or, when most cells with such evidence were disturbed, every cell measured before it (the
        whole measurement is suspect, also where passes could not show it; module docstring)."""
        old = now - self.measured_at > max_age_s
        seen = (self.observed < self.measured) & (self.observed_at >= self.measured_at)  # evidence either way
        low = seen & (self.observed < INCONSISTENT * self.measured)
        suspect = np.zeros_like(old)
        if low.any() and 2 * int(low.sum()) >= int(seen.sum()):
            suspect = self.measured_at <= self.observed_at[low].max()
        return [(int(i), int(j)) for i, j in zip(*np.nonzero(old | low | suspect), strict=True)]

    def remeasured(self, timed: dict[Cell, float], now: float) -> None:
        for (i, j), seconds in timed.items():
            self.measured[i, j] = seconds
            self.measured_at[i, j] = now

    def merge(self, bounds: NDArray[np.float64], now: float) -> bool:
        """Keep the bounds that are lower than those kept; returns whether any was."""
        lower = bounds < self.observed
        self.observed[lower] = bounds[lower]
        self.observed_at[lower] = now
        return bool(lower.any())

    def to_json(self) -> dict[str, Any]:
        grid = self.measured[:, :-1].tolist()
        return {"version": 2, "batch_sizes": list(self.batch_sizes), "tokens": list(self.tokens),
                "context": self.context, "seconds": grid, "verify_one": self.measured[:, -1].tolist(),
                "measured_at": self.measured_at.tolist(), "observed": _json_grid(self.observed),
                "observed_at": _json_grid(self.observed_at)}

    @classmethod
    def from_json(cls, data: dict[str, Any], written: float) -> CacheEntry:
        """Version 1 entries (measurements only) count as measured when their file was `written`."""
        batches, tokens = tuple(int(b) for b in data["batch_sizes"]), tuple(int(t) for t in data["tokens"])
        shape = (len(batches), len(tokens) + 1)
        measured = _grid([[*row, v] for row, v in zip(data["seconds"], data["verify_one"], strict=True)], shape,
                         math.nan)
        if not np.isfinite(measured).all() or (measured <= 0).any():
            raise ValueError("measured seconds must be positive")
        if data.get("version", 1) == 1:
            at, observed, observed_at = np.full(shape, written), np.full(shape, np.inf), np.full(shape, -np.inf)
        else:
            at = _grid(data["measured_at"], shape, math.nan)
            observed = _grid(data["observed"], shape, np.inf)
            observed_at = _grid(data["observed_at"], shape, -np.inf)
        return cls(batches, tokens, int(data.get("context", 0)), measured, at, observed, observed_at)


@contextmanager
def _threads(n: int) -> Iterator[None]:
    """torch at `n` threads inside, as it was after."""
    was = torch.get_num_threads()
    if was != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if was != n:
            torch.set_num_threads(was)


class ProfileStore:
    """A model's cached profile on this machine, kept honest by the passes it prices.

    `open` reads the cache and measures what is missing or due (reporting to `progress`);
    `update`, after each rollout step, keeps what a CostEvidence learned, re-measures the cells
    it shows were measured disturbed (each at most once per run) and rebases the evidence on the
    result. Every change is written back at once (atomically). Measurements run at the thread count
    the key names, whatever count a ThreadChooser has the passes at (rollout.adaptive_threads), and
    the evidence comes from passes at that count only (DraftCapController.profiled).
    """

    def __init__(self, model: TinyLlama, path: Path, entry: CacheEntry, progress: Progress | None,
                 max_age_s: float) -> None:
        self.model = model
        self.path = path
        self.entry = entry
        self.progress = progress
        self.max_age_s = max_age_s
        self.measured: set[Cell] = set()  # cells this run measured
        self.threads = torch.get_num_threads()  # what the key names; passes may run at another (ThreadChooser)

    @classmethod
    def open(cls, model: TinyLlama, context: int = 256, batches: tuple[int, ...] = BATCHES,
             tokens: tuple[int, ...] = TOKENS, progress: Progress | None = None, max_age_s: float = MAX_AGE_S,
             folder: Path | None = None) -> ProfileStore:
        path = (folder or cache_dir()) / f"{profile_key(model, context, batches, tokens)}.json"
        entry = None
        if path.is_file():
            try:
                entry = CacheEntry.from_json(json.loads(path.read_text()), path.stat().st_mtime)
                if (entry.batch_sizes, entry.tokens) != (batches, tokens):
                    raise ValueError("grid axes differ from the key's")
            except (ValueError, KeyError, TypeError):
                entry = None  # a damaged entry is measured afresh, never trusted
        now = time.time()
        if entry is None:
            every = [(i, j) for i in range(len(batches)) for j in range(len(tokens) + 1)]
            timed = measure_cells(model, context, batches, tokens, every, progress=progress, budget_s=FIRST_BUDGET_S)
            store = cls(model, path, CacheEntry.measured_now(batches, tokens, context, timed, now), progress,
                        max_age_s)
            store.measured |= set(timed)
            store.write()
            return store
        store = cls(model, path, entry, progress, max_age_s)
        if not store.remeasure(entry.due(now, max_age_s), FIRST_BUDGET_S) and progress is not None:
            progress(0, 0)
        return store

    @property
    def profile(self) -> CostProfile:
        return self.entry.profile()

    def remeasure(self, cells: Sequence[Cell], budget_s: float = math.inf) -> int:
        """Measure `cells` again (cheapest first, none started after `budget_s`), except those this
        run measured already; written back. Returns how many were measured."""
        todo = [c for c in cells if c not in self.measured]
        if not todo:
            return 0
        e = self.entry
        with _threads(self.threads):
            timed = measure_cells(self.model, e.context, e.batch_sizes, e.tokens, todo, progress=self.progress,
                                  budget_s=budget_s)
        e.remeasured(timed, time.time())
        self.measured |= set(timed)
        self.write()
        return len(timed)

    def update(self, evidence: CostEvidence) -> int:
        """After a rollout step: keep `evidence`'s bounds, re-measure the cells they show were
        measured disturbed, rebase `evidence` on the result. Returns how many cells were measured."""
        now = time.time()
        if self.entry.merge(evidence.bounds, now):
            self.write()
        measured = self.remeasure(self.entry.due(now, self.max_age_s), STEP_BUDGET_S)
        evidence.rebase(self.profile)
        return measured

    def write(self) -> None:
        with user_paths("write the verify-cost profile cache", self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_text(self.path, json.dumps(self.entry.to_json()) + "\n")


def load_or_measure(model: TinyLlama, context: int = 256, batches: tuple[int, ...] = BATCHES,
                    tokens: tuple[int, ...] = TOKENS, progress: Progress | None = None) -> CostProfile:
    """The cached profile, measured where missing or due (ProfileStore.open)."""
    return ProfileStore.open(model, context, batches, tokens, progress).profile
