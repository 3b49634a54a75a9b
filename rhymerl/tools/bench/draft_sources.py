"""Draft sources the drafter and acceptance benchmarks compare, behind one batched interface.

Why one interface: the benchmarks replay the same sequences through every source in lockstep, so
the only difference between rows is where drafts come from (and what that costs):

- `HistoSpecSource`: our native index + batched AIMD drafter (one native call per engine step);
- `ArcticSource`: Snowflake's arctic-inference SuffixDecodingCache (per-prompt cache holding last
  epoch's responses, as its vLLM integration drives it: add tokens, then speculate, per request);
- `NgramSource`: a vLLM-style n-gram proposer over each sequence's own context (native scan).

Arctic and n-gram get the same AIMD window policy as ours (applied here, outside their timed calls),
so acceptance differences come from the drafts. Also: realistic synthetic histories and the
vectorised verifier that decides how much of each draft a target sequence accepts.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rhymerl.algorithms.drafting import HistoryDrafter, HistoryIndex
from rhymerl.algorithms.drafting import _suffix_index as _native

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]


@dataclass(frozen=True)
class Knobs:
    """HistoSpec's drafting knobs (RLJob `rollout.speculation`), shared by every source."""

    prefix_max: int = 7
    prefix_min: int = 3
    window_initial: int = 2
    window_step: int = 2
    window_max: int = 32
    min_prob: float = 0.0


@dataclass
class PromptWork:
    """One prompt's history (previous epoch: tokens + rewards) and the responses to replay against it."""

    prompt_id: str
    prompt: I32
    history: list[tuple[I32, float]]
    targets: list[I32]
    epoch: int = 0  # epoch of the targets (0 for synthetic data)

    @property
    def history_tokens(self) -> int:
        return sum(len(t) for t, _ in self.history)


# ---------------------------------------------------------------------------------------------
# Synthetic histories


def synthetic_workload(
    prompts: int = 4,
    responses: int = 16,
    length: int = 16384,
    vocab: int = 32000,
    seed: int = 0,
) -> list[PromptWork]:
    """Histories that look like RL rollouts of one prompt across two adjacent epochs.

    Each prompt has a pool of phrases (Zipf-distributed token ids, lengths 1-24) and three solution
    paths made of phrases, so a response repeats formulas internally and shares long spans with its
    siblings. A response follows one path with phrase-level edits (substitute, insert, delete: ~9%
    of phrases) and 0.5% token noise. Path 0 is the "correct" one (reward 1 with p=0.8, others 0.3);
    the next epoch's responses pick path 0 more often, as a policy trained on the rewards would.
    """
    rng = np.random.default_rng(seed)
    work = []
    ranks = rng.permutation(vocab)
    for p in range(prompts):
        n_phr = 800
        phrase_len = np.clip(rng.geometric(1 / 7, size=n_phr), 1, 24)
        zipf = np.minimum(rng.zipf(1.25, size=int(phrase_len.sum())) - 1, vocab - 1)
        flat = ranks[zipf].astype(np.int32)
        cuts = np.concatenate([[0], np.cumsum(phrase_len)])
        phrases = [flat[cuts[i] : cuts[i + 1]] for i in range(n_phr)]
        popularity: NDArray[np.float64] = 1.0 / np.arange(1, n_phr + 1, dtype=np.float64) ** 0.9
        popularity /= popularity.sum()
        n_steps = int(length / phrase_len.mean() * 1.3) + 16
        base = rng.choice(n_phr, size=n_steps, p=popularity)
        paths = [base]
        for _ in range(2):
            path = base.copy()
            change = rng.random(n_steps) < 0.15
            path[change] = rng.choice(n_phr, size=int(change.sum()), p=popularity)
            paths.append(path)

        pool = _PhrasePool(phrases, popularity, ranks, vocab)
        history = [_respond(rng, pool, paths, (0.4, 0.3, 0.3), length) for _ in range(responses)]
        targets = [_respond(rng, pool, paths, (0.6, 0.2, 0.2), length)[0] for _ in range(responses)]
        work.append(PromptWork(f"synthetic-{p}", np.zeros(0, dtype=np.int32), history, targets, epoch=1))
    return work


@dataclass
class _PhrasePool:
    phrases: list[I32]
    popularity: NDArray[np.float64]
    ranks: NDArray[np.int64]
    vocab: int


def _respond(
    rng: np.random.Generator, pool: _PhrasePool, paths: list[I64], path_weights: Sequence[float], length: int
) -> tuple[I32, float]:
    """One response: a solution path with phrase-level edits and token noise, and its reward."""
    k = int(rng.choice(len(paths), p=np.asarray(path_weights)))
    n_phr = len(pool.phrases)
    parts: list[I32] = []
    total = 0
    for ph in paths[k]:
        u = rng.random()
        if u < 0.03:  # delete
            continue
        if u < 0.06:  # substitute
            ph = rng.choice(n_phr, p=pool.popularity)
        elif u < 0.09:  # insert an extra phrase first
            extra = pool.phrases[int(rng.choice(n_phr, p=pool.popularity))]
            parts.append(extra)
            total += len(extra)
        parts.append(pool.phrases[int(ph)])
        total += len(pool.phrases[int(ph)])
        if total >= length:
            break
    seq = np.concatenate(parts)[:length].copy()
    noise = rng.random(seq.size) < 0.005
    seq[noise] = pool.ranks[np.minimum(rng.zipf(1.25, size=int(noise.sum())) - 1, pool.vocab - 1)]
    reward = float(rng.random() < (0.8 if k == 0 else 0.3))
    return seq.astype(np.int32), reward


def dump_workload(run_dir: Any, latest_only: bool = False) -> list[PromptWork]:
    """(prompt, epoch e) units from a run's rollout dumps: history = epoch e-1 responses of the prompt."""
    from rhymerl.workers.dumps import read_run

    records = read_run(run_dir)
    groups: dict[tuple[str, int], list[Any]] = {}
    for rec in records:
        groups.setdefault((rec.prompt_id, rec.epoch), []).append(rec)
    units = []
    for (pid, epoch), recs in sorted(groups.items()):
        prev = groups.get((pid, epoch - 1))
        if not prev:
            continue
        units.append(
            PromptWork(
                prompt_id=pid,
                prompt=np.asarray(recs[0].prompt_ids, dtype=np.int32),
                history=[(np.asarray(r.response_ids, dtype=np.int32), float(r.reward)) for r in prev],
                targets=[np.asarray(r.response_ids, dtype=np.int32) for r in recs],
                epoch=epoch,
            )
        )
    if latest_only:
        last: dict[str, PromptWork] = {}
        for u in units:
            last[u.prompt_id] = u
        units = list(last.values())
    return units


# ---------------------------------------------------------------------------------------------
# Verification


def accepted_lengths(offsets: I64, tokens: I32, targets: I32, positions: I64, target_lens: I64) -> I64:
    """Accepted prefix length of each draft: drafts[i] vs targets[i, positions[i]:] (row-major 2-D)."""
    lens = np.diff(offsets)
    if tokens.size == 0:
        return np.zeros(lens.size, dtype=np.int64)
    seg = np.repeat(np.arange(lens.size), lens)
    k = np.arange(tokens.size) - offsets[:-1][seg]
    col = positions[seg] + k
    valid = col < target_lens[seg]
    truth = targets[seg, np.minimum(col, targets.shape[1] - 1)]
    bad_k = np.where((tokens != truth) | ~valid, k, np.iinfo(np.int64).max)
    first_bad = np.full(lens.size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_bad, seg, bad_k)
    return np.minimum(lens, first_bad)


def gather_new_tokens(targets: I32, positions: I64, counts: I64) -> tuple[I64, I32]:
    """Flat (offsets, tokens) of targets[i, positions[i] : positions[i] + counts[i]]."""
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    seg = np.repeat(np.arange(counts.size), counts)
    k = np.arange(int(offsets[-1])) - offsets[:-1][seg]
    return offsets, targets[seg, positions[seg] + k].astype(np.int32)


def pad_rows(rows: Sequence[I32], extra: int = 0) -> tuple[I32, I64]:
    width = max((len(r) for r in rows), default=0) + extra + 1
    out = np.zeros((len(rows), width), dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out, np.asarray([len(r) for r in rows], dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Sources


class Source(ABC):
    """A batch of sequences being drafted for; slots are positions 0..n-1 of `start`'s list."""

    name: str = ""

    @abstractmethod
    def start(self, units: Sequence[int], prompts: Sequence[I32], contexts: Sequence[I32], capacity: int) -> None:
        """Begin len(units) sequences: unit index (which prompt's history), prompt, tokens so far."""

    @abstractmethod
    def restart(self, slot: int, unit: int, prompt: I32, context: I32) -> None:
        """Replace the sequence in `slot` by a new one (untimed)."""

    @abstractmethod
    def step(self, offsets: I64, tokens: I32, accepted: I32 | None) -> tuple[I64, I32, float]:
        """Report acceptance, feed new tokens, draft, for every slot; returns drafts and timed seconds."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release per-sequence state."""


class AIMD:
    """The AIMD window rule applied outside a source that has none (arctic, n-gram)."""

    def __init__(self, knobs: Knobs, n: int) -> None:
        self.k = knobs
        self.window = np.full(n, knobs.window_initial, dtype=np.int32)
        self.last = np.zeros(n, dtype=np.int32)

    def update(self, accepted: I32 | None) -> None:
        if accepted is None:
            return
        had = self.last > 0
        full = had & (accepted >= self.last)
        self.window[full] = np.minimum(self.window[full] + self.k.window_step, self.k.window_max)
        self.window[had & ~full] = self.k.window_initial
        self.last[:] = 0

    def reset(self, slot: int) -> None:
        self.window[slot] = self.k.window_initial
        self.last[slot] = 0


class HistoSpecSource(Source):
    def __init__(self, indexes: Sequence[HistoryIndex], knobs: Knobs, name: str = "histospec") -> None:
        self.name = name
        self.indexes = indexes
        self.knobs = knobs
        self.drafter = HistoryDrafter(
            prefix_max=knobs.prefix_max,
            prefix_min=knobs.prefix_min,
            window_initial=knobs.window_initial,
            window_step=knobs.window_step,
            window_max=knobs.window_max,
            min_prob=knobs.min_prob,
        )
        self.handles = np.zeros(0, dtype=np.int64)
        self.out_offsets = np.zeros(1, dtype=np.int64)
        self.out_tokens = np.zeros(0, dtype=np.int32)

    def start(self, units: Sequence[int], prompts: Sequence[I32], contexts: Sequence[I32], capacity: int) -> None:
        self.handles = np.asarray(
            [self.drafter.add(self.indexes[u], c) for u, c in zip(units, contexts, strict=True)], dtype=np.int64
        )
        # an engine keeps its draft buffers: step_into writes there without allocating
        self.out_offsets = np.zeros(len(units) + 1, dtype=np.int64)
        self.out_tokens = np.zeros(len(units) * self.knobs.window_max, dtype=np.int32)

    def restart(self, slot: int, unit: int, prompt: I32, context: I32) -> None:
        self.drafter.remove(int(self.handles[slot]))
        self.handles[slot] = self.drafter.add(self.indexes[unit], context)

    def step(self, offsets: I64, tokens: I32, accepted: I32 | None) -> tuple[I64, I32, float]:
        t0 = time.perf_counter()
        total = self.drafter.step_into(self.handles, offsets, tokens, accepted, self.out_offsets, self.out_tokens)
        elapsed = time.perf_counter() - t0
        return self.out_offsets.copy(), self.out_tokens[:total].copy(), elapsed

    def close(self) -> None:
        if self.handles.size:
            self.drafter.remove(self.handles)
        self.handles = np.zeros(0, dtype=np.int64)


class NgramSource(Source):
    def __init__(self, knobs: Knobs, name: str = "n-gram") -> None:
        self.name = name
        self.knobs = knobs
        self.buf = np.zeros((0, 1), dtype=np.int32)
        self.lengths = np.zeros(0, dtype=np.int64)
        self.aimd = AIMD(knobs, 0)

    def start(self, units: Sequence[int], prompts: Sequence[I32], contexts: Sequence[I32], capacity: int) -> None:
        n = len(units)
        width = max((len(p) for p in prompts), default=0) + capacity + self.knobs.window_max + 2
        self.buf = np.zeros((n, width), dtype=np.int32)
        self.lengths = np.zeros(n, dtype=np.int64)
        for i in range(n):
            self._load(i, prompts[i], contexts[i])
        self.aimd = AIMD(self.knobs, n)

    def _load(self, slot: int, prompt: I32, context: I32) -> None:
        row = np.concatenate([prompt, context])
        self.buf[slot, : row.size] = row
        self.lengths[slot] = row.size

    def restart(self, slot: int, unit: int, prompt: I32, context: I32) -> None:
        self._load(slot, prompt, context)
        self.aimd.reset(slot)

    def step(self, offsets: I64, tokens: I32, accepted: I32 | None) -> tuple[I64, I32, float]:
        self.aimd.update(accepted)
        t0 = time.perf_counter()
        counts = np.diff(offsets)
        if tokens.size:
            seg = np.repeat(np.arange(counts.size), counts)
            k = np.arange(tokens.size) - offsets[:-1][seg]
            self.buf[seg, self.lengths[seg] + k] = tokens
            self.lengths += counts
        out_off, out_tok = _native.ngram_draft(
            self.buf, self.lengths, self.aimd.window, self.knobs.prefix_min, self.knobs.prefix_max
        )
        elapsed = time.perf_counter() - t0
        self.aimd.last[:] = np.diff(out_off)
        return out_off, out_tok, elapsed


def arctic_status() -> tuple[bool, str]:
    """Whether arctic-inference's suffix decoding can be imported here, and why not."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except Exception as exc:  # any import failure (missing package, missing native module, ABI)
        return False, f"arctic-inference not available ({type(exc).__name__}: {exc})"
    try:
        from importlib.metadata import version

        return True, f"arctic-inference {version('arctic-inference')}"
    except Exception:
        return True, "arctic-inference (version unknown)"


@dataclass
class ArcticCaches:
    """One SuffixDecodingCache per prompt unit, holding that unit's history responses."""

    depth: int
    caches: list[Any] = field(default_factory=list)
    build_seconds: float = 0.0
    tokens: int = 0

    @classmethod
    def build(cls, units: Sequence[PromptWork], depth: int) -> ArcticCaches:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        out = cls(depth)
        for u in units:
            t0 = time.perf_counter()
            cache = SuffixDecodingCache(max_tree_depth=depth)
            for j, (tokens, _) in enumerate(u.history):
                key = ("history", j)
                cache.start_request(key, u.prompt)
                cache.add_active_response(key, tokens)
                cache.stop_request(key)
            out.build_seconds += time.perf_counter() - t0
            out.tokens += u.history_tokens
            # Sequences being generated must not enter the shared tree: the comparison is about drafting
            # from last epoch (siblings replayed in lockstep would otherwise leak their futures). With
            # no global slots, a live request keeps only its local tree (prompt + own response).
            cache._max_cached_requests = 0
            out.caches.append(cache)
        return out


class ArcticSource(Source):
    """Drives arctic's cache the way its vLLM proposer does: per request, add tokens then speculate."""

    def __init__(self, caches: ArcticCaches, knobs: Knobs, name: str = "arctic", max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1, prefill_tail: int | None = None) -> None:
        self.name = name
        self.caches = caches
        self.knobs = knobs
        self.factor = max_spec_factor
        self.min_prob = min_token_prob
        self.prefill_tail = prefill_tail  # insert only the last N context tokens when starting a sequence
        self.reqs: list[tuple[int, Any]] = []
        self.ctx = np.zeros((0, 1), dtype=np.int32)
        self.lengths = np.zeros(0, dtype=np.int64)
        self.aimd = AIMD(knobs, 0)
        self._serial = 0

    def _open(self, slot: int, unit: int, prompt: I32, context: I32) -> None:
        cache = self.caches.caches[unit]
        self._serial += 1
        key = ("live", self._serial)
        cache.start_request(key, prompt)
        tail = context if self.prefill_tail is None else context[-self.prefill_tail :]
        if tail.size:
            cache.add_active_response(key, np.ascontiguousarray(tail, dtype=np.int32))
        self.reqs[slot] = (unit, key)
        self.ctx[slot, : context.size] = context
        self.lengths[slot] = context.size

    def _close(self, slot: int) -> None:
        unit, key = self.reqs[slot]
        self.caches.caches[unit].stop_request(key)

    def start(self, units: Sequence[int], prompts: Sequence[I32], contexts: Sequence[I32], capacity: int) -> None:
        n = len(units)
        self.reqs = [(0, None)] * n
        self.ctx = np.zeros((n, capacity + self.knobs.window_max + 2), dtype=np.int32)
        self.lengths = np.zeros(n, dtype=np.int64)
        for i in range(n):
            self._open(i, units[i], prompts[i], contexts[i])
        self.aimd = AIMD(self.knobs, n)

    def restart(self, slot: int, unit: int, prompt: I32, context: I32) -> None:
        self._close(slot)
        self._open(slot, unit, prompt, context)
        self.aimd.reset(slot)

    def step(self, offsets: I64, tokens: I32, accepted: I32 | None) -> tuple[I64, I32, float]:
        self.aimd.update(accepted)
        n = len(self.reqs)
        drafts: list[list[int]] = []
        depth = self.caches.depth
        elapsed = 0.0
        for i in range(n):
            unit, key = self.reqs[i]
            cache = self.caches.caches[unit]
            new = tokens[offsets[i] : offsets[i + 1]]
            length = int(self.lengths[i])
            self.ctx[i, length : length + new.size] = new
            length += new.size
            self.lengths[i] = length
            window = int(self.aimd.window[i])
            context = self.ctx[i, max(0, length - depth) : length]
            t0 = time.perf_counter()
            if new.size:
                cache.add_active_response(key, new)
            draft = cache.speculate(key, context, max_spec_tokens=window, max_spec_factor=self.factor,
                                    min_token_prob=self.min_prob)
            elapsed += time.perf_counter() - t0
            drafts.append(draft.token_ids[:window])
        lens = np.asarray([len(d) for d in drafts], dtype=np.int64)
        out_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=out_off[1:])
        flat = np.fromiter((t for d in drafts for t in d), dtype=np.int32, count=int(out_off[-1]))
        self.aimd.last[:] = lens
        return out_off, flat, elapsed

    def close(self) -> None:
        for i in range(len(self.reqs)):
            if self.reqs[i][1] is not None:
                self._close(i)
        self.reqs = []


# ---------------------------------------------------------------------------------------------
# Lockstep replay: every sequence drafts, the verifier accepts the matching prefix plus the one
# token the model produces, and the sequence advances, like an engine's decode loop.


@dataclass
class ReplayStats:
    batch: int
    step_seconds: list[float] = field(default_factory=list)  # timed part of each batched step
    generated: int = 0  # target tokens covered
    accepted: int = 0  # draft tokens accepted
    drafted: int = 0  # draft tokens proposed
    verify_steps: int = 0  # sequence-steps (one forward pass per sequence and step)

    @property
    def accepted_fraction(self) -> float:
        return self.accepted / max(self.generated, 1)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(self.drafted, 1)

    @property
    def tokens_per_step(self) -> float:
        return self.generated / max(self.verify_steps, 1)

    def per_sequence_us(self) -> NDArray[np.float64]:
        return np.asarray(self.step_seconds, dtype=np.float64) / max(self.batch, 1) * 1e6


def replay(
    source: Source,
    units: Sequence[int],
    prompts: Sequence[I32],
    targets: Sequence[I32],
    starts: Sequence[int],
    *,
    iterations: int | None = None,
    rng: np.random.Generator | None = None,
    restart_fraction: float = 0.9,
) -> ReplayStats:
    """Generate `targets` (from `starts`) through `source`'s drafts.

    iterations=None: run until every sequence is complete (acceptance measurement). Otherwise run
    that many batched steps, restarting finished sequences at a random point (latency measurement).
    """
    n = len(targets)
    rows, tlens = pad_rows(targets, extra=source_pad(source))
    pos = np.asarray(starts, dtype=np.int64).copy()
    source.start(units, prompts, [t[: int(s)] for t, s in zip(targets, pos, strict=True)], rows.shape[1])
    stats = ReplayStats(batch=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    tokens = np.zeros(0, dtype=np.int32)
    accepted: I32 | None = None
    active = pos < tlens
    rng = rng or np.random.default_rng(0)
    done_steps = 0
    while active.any() if iterations is None else done_steps < iterations:
        d_off, d_tok, secs = source.step(offsets, tokens, accepted)
        stats.step_seconds.append(secs)
        acc = accepted_lengths(d_off, d_tok, rows, pos, tlens)
        lens = np.diff(d_off)
        counts = np.where(active, np.minimum(acc + 1, tlens - pos), 0)
        stats.drafted += int(lens[active].sum())
        stats.accepted += int(acc[active].sum())
        stats.generated += int(counts.sum())
        stats.verify_steps += int(active.sum())
        new_pos = pos + counts
        if iterations is not None:
            finished = np.flatnonzero(new_pos >= tlens)
            for i in finished.tolist():
                start = int(rng.integers(0, max(1, int(tlens[i] * restart_fraction))))
                source.restart(i, units[i], prompts[i], targets[i][:start])
                counts[i], acc[i], pos[i], new_pos[i] = 0, 0, start, start
        offsets, tokens = gather_new_tokens(rows, pos, counts)
        pos = new_pos
        accepted = acc.astype(np.int32)
        if iterations is None:
            active &= pos < tlens
        done_steps += 1
    source.close()
    return stats


def source_pad(source: Source) -> int:
    knobs = getattr(source, "knobs", None)
    return (knobs.window_max if isinstance(knobs, Knobs) else 64) + 2


def replay_units(source: Source, units: Sequence[PromptWork]) -> ReplayStats:
    """Replay every target response of every unit from its start against the unit's history."""
    seq_units, prompts, targets = [], [], []
    for i, u in enumerate(units):
        for t in u.targets:
            seq_units.append(i)
            prompts.append(u.prompt)
            targets.append(t)
    return replay(source, seq_units, prompts, targets, [0] * len(targets))
