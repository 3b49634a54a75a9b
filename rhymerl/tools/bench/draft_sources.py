"""Draft sources the drafter and acceptance benchmarks compare, behind one batched interface.

Why one interface: the benchmarks replay the same sequences through every source in lockstep, so
the only difference between rows is where drafts come from (and what that costs):

- `HistoSpecSource`: our native index + batched AIMD drafter (one native call per engine step);
- `ArcticSource`: Snowflake's arctic-inference SuffixDecodingCache (per-prompt cache holding last
  epoch's responses, as its vLLM integration drives it: add tokens, then speculate, per request);
- `NgramSource`: a vLLM-style n-gram proposer over each sequence's own context (native scan);
- `FastestOfNSource`: several of the above, each sequence taking the draft of the one its own
  emitted tokens confirmed most (Fastest-of-N).

Arctic and n-gram get the same AIMD window rule as ours (applied here, outside their timed calls),
so acceptance differences come from the drafts. Workloads: draft_workloads.py; the lockstep replay
and verifier: draft_replay.py.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rhymerl.algorithms.drafting import AimdWindows, GroupIndex, HistoryDrafter, HistoryIndex, ngram_draft
from rhymerl.algorithms.drafting.fastest_of_n import SourceChoice, matched, told_accepted
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.tools.bench.draft_workloads import PromptWork

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]


def knob_record(knobs: SpeculationSpec) -> dict[str, float]:
    """The drafting knobs a bench ran with, as its results.json records them."""
    return {"prefix_max": knobs.prefix.max, "prefix_min": knobs.prefix.min, "window_initial": knobs.window.initial,
            "window_step": knobs.window.step, "window_max": knobs.window.max, "min_prob": knobs.min_prob,
            "history_epochs": knobs.history_epochs, "recent_tokens": knobs.recent_tokens}




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
    """AIMD windows (the one native rule, `AimdWindows`) for a source that keeps none (arctic,
    n-gram), with each row's last draft length, which the next verify round reports on."""

    def __init__(self, knobs: SpeculationSpec, n: int) -> None:
        self.windows = AimdWindows(knobs.window, n)
        self.last = np.zeros(n, dtype=np.int32)

    @property
    def window(self) -> I32:
        return self.windows.windows

    def update(self, accepted: I32 | None) -> None:
        if accepted is None:
            return
        self.windows.update(self.last, accepted)
        self.last[:] = 0

    def reset(self, slot: int) -> None:
        self.windows.reset(slot)
        self.last[slot] = 0


class HistoSpecSource(Source):
    """The history drafter; with `groups`, each unit's sequences also share a `GroupIndex` that they
    grow as they are replayed (the siblings of a step generated together), and `indexes` may hold
    None for a unit without history."""

    def __init__(self, indexes: Sequence[HistoryIndex | None], knobs: SpeculationSpec, name: str = "histospec",
                 groups: bool = False) -> None:
        self.name = name
        self.indexes = indexes
        self.knobs = knobs
        self.drafter = HistoryDrafter(knobs)
        self.groups: list[GroupIndex] | None = [GroupIndex.for_spec(knobs) for _ in indexes] if groups else None
        self.handles = np.zeros(0, dtype=np.int64)
        self.out_offsets = np.zeros(1, dtype=np.int64)
        self.out_tokens = np.zeros(0, dtype=np.int32)

    def _add(self, unit: int, context: I32) -> int:
        return self.drafter.add(self.indexes[unit], context,
                                group=self.groups[unit] if self.groups is not None else None)

    def start(self, units: Sequence[int], prompts: Sequence[I32], contexts: Sequence[I32], capacity: int) -> None:
        self.handles = np.asarray([self._add(u, c) for u, c in zip(units, contexts, strict=True)], dtype=np.int64)
        # an engine keeps its draft buffers: step_into writes there without allocating
        self.out_offsets = np.zeros(len(units) + 1, dtype=np.int64)
        self.out_tokens = np.zeros(len(units) * self.knobs.window.max, dtype=np.int32)

    def restart(self, slot: int, unit: int, prompt: I32, context: I32) -> None:
        self.drafter.remove(int(self.handles[slot]))
        self.handles[slot] = self._add(unit, context)

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
    def __init__(self, knobs: SpeculationSpec, name: str = "n-gram") -> None:
        self.name = name
        self.knobs = knobs
        self.buf = np.zeros((0, 1), dtype=np.int32)
        self.lengths = np.zeros(0, dtype=np.int64)
        self.aimd = AIMD(knobs, 0)

    def start(self, units: Sequence[int], prompts: Sequence[I32], contexts: Sequence[I32], capacity: int) -> None:
        n = len(units)
        width = max((len(p) for p in prompts), default=0) + capacity + self.knobs.window.max + 2
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
        out_off, out_tok = ngram_draft(
            self.buf, self.lengths, self.aimd.window, self.knobs.prefix.min, self.knobs.prefix.max
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

    def __init__(self, caches: ArcticCaches, knobs: SpeculationSpec, name: str = "arctic", max_spec_factor: float = 1.0,
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
        self.ctx = np.zeros((n, capacity + self.knobs.window.max + 2), dtype=np.int32)
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


class FastestOfNSource(Source):
    """Fastest-of-N over other sources: every source drafts every step (its own AIMD window, told
    how much of its last draft the emitted tokens confirmed), and each sequence gets the draft of
    the source its own tokens confirmed most (`SourceChoice`). Only what an engine sees scores a
    source: the emitted tokens, never the rest of the target. `served` counts non-empty drafts
    handed out per source."""

    def __init__(self, sources: Sequence[Source], name: str = "fastest-of-n", decay: float = 0.8) -> None:
        self.name = name
        self.sources = list(sources)
        self.decay = decay
        self.choice = SourceChoice(0, len(self.sources), decay)
        self.last: list[tuple[I64, I32]] = []
        self.served = np.zeros(len(self.sources), dtype=np.int64)

    def start(self, units: Sequence[int], prompts: Sequence[I32], contexts: Sequence[I32], capacity: int) -> None:
        for source in self.sources:
            source.start(units, prompts, contexts, capacity)
        self.choice = SourceChoice(len(units), len(self.sources), self.decay)
        empty = (np.zeros(len(units) + 1, dtype=np.int64), np.zeros(0, dtype=np.int32))
        self.last = [empty] * len(self.sources)

    def restart(self, slot: int, unit: int, prompt: I32, context: I32) -> None:
        for source in self.sources:
            source.restart(slot, unit, prompt, context)
        self.choice.reset(slot)

    def step(self, offsets: I64, tokens: I32, accepted: I32 | None) -> tuple[I64, I32, float]:
        n = offsets.size - 1
        confirmed = np.zeros((n, len(self.sources)), dtype=np.int64)
        windows = np.zeros((n, len(self.sources)), dtype=np.int32)  # what each source's AIMD window is told
        for k, (d_off, d_tok) in enumerate(self.last):
            for i in range(n):
                draft = d_tok[d_off[i]: d_off[i + 1]].tolist()
                emitted = tokens[offsets[i]: offsets[i + 1]].tolist()
                confirmed[i, k] = matched(draft, emitted)
                windows[i, k] = told_accepted(draft, emitted)
        if accepted is not None:
            self.choice.observe(confirmed)
        seconds = 0.0
        drafts = []
        for k, source in enumerate(self.sources):
            d_off, d_tok, secs = source.step(offsets, tokens, None if accepted is None else windows[:, k])
            drafts.append((d_off, d_tok))
            seconds += secs
        self.last = drafts
        picks = self.choice.choose()
        rows = [drafts[int(k)][1][drafts[int(k)][0][i]: drafts[int(k)][0][i + 1]] for i, k in enumerate(picks)]
        out_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=out_off[1:])
        for i, k in enumerate(picks):
            self.served[int(k)] += len(rows[i]) > 0
        return out_off, (np.concatenate(rows) if rows else np.zeros(0, dtype=np.int32)).astype(np.int32), seconds

    def close(self) -> None:
        for source in self.sources:
            source.close()
