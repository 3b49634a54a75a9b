"""Draft sources the drafter and acceptance benchmarks compare, behind one batched interface.

Why one interface: the benchmarks replay the same sequences through every source in lockstep, so
the only difference between rows is where drafts come from (and what that costs). Every source but
one is the rollout engine's own `DraftSource`, driven by `EngineSource` as the torch engine drives
it, so the benches measure what a job runs:

- `histospec`: HistoSpec, `HistoryDrafts` (our native index + batched AIMD drafter, with the
  group's responses where asked);
- `ngram`: `NgramDrafts`, a vLLM-style n-gram proposer over each sequence's own context;
- `fastest_of_n`: `FastestOfNDrafts` over several of those, each sequence taking the draft of the
  one its own emitted tokens confirmed most.

The one foreign source is `ArcticSource`: Snowflake's arctic-inference SuffixDecodingCache
(per-prompt cache holding last epoch's responses, as its vLLM integration drives it: add tokens,
then speculate, per request), given the same AIMD window rule as ours (applied here, outside its
timed calls), so acceptance differences come from the drafts. Workloads: draft_workloads.py; the
lockstep replay and verifier: draft_replay.py.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rhymerl.algorithms.drafting import AimdWindows, HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.tools.bench.draft_workloads import PromptWork
from rhymerl.workers.rollout.engine import DraftSource
from rhymerl.workers.rollout.fastest_of_n import FastestOfNDrafts
from rhymerl.workers.rollout.generation import GenRequest
from rhymerl.workers.rollout.speculators import DraftCapController, HistoryDrafts, NgramDrafts

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
    """AIMD windows (the one native rule, `AimdWindows`) for arctic, which keeps none, with each
    row's last draft length, which the next verify round reports on."""

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


class EngineSource(Source):
    """A rollout engine's `DraftSource` replayed in lockstep, sequence i in slot i (unit u is prompt
    id str(u)). Each step settles the last drafts (drafted, accepted, emitted tokens) and proposes the
    next, as a verify pass of the torch engine does; a sequence that starts with tokens is begun and
    settled with them, as a resumed one is. Timed: `settle` + `propose` (report + feed + draft), not the
    conversion between the replay's arrays and the engine's lists. `make(width)` builds the source for
    contexts (prompt + response) of at most `width` tokens; `served` counts the non-empty drafts
    handed out per source (`source_of`).

    catch_up: a source that takes in a sequence's tokens only when it next proposes (`HistoryDrafts`)
    is asked once more, untimed, for the sequences that start with tokens, and that proposal is not
    handed out, so their tokens are taken in untimed, as the replay's starts are; its `settle` then
    reports nothing on that proposal (the slot drafted 0 as far as the replay knows)."""

    def __init__(self, name: str, knobs: SpeculationSpec, make: Callable[[int], DraftSource],
                 catch_up: bool = False) -> None:
        self.name = name
        self.knobs = knobs
        self.make = make
        self.catch_up = catch_up
        self.drafts: DraftSource | None = None
        self.last: list[int] = []  # each slot's last draft length, which the next step settles
        self.served: dict[str, int] = {}

    @property
    def source(self) -> DraftSource:
        if self.drafts is None:
            raise RuntimeError(f"{self.name}: not started")
        return self.drafts

    def _begin(self, slot: int, unit: int, prompt: I32, context: I32) -> None:
        self.source.begin(slot, GenRequest(prompt.tolist(), slot, str(unit)))
        if context.size:
            self.source.settle([slot], [0], [0], [context.tolist()])

    def start(self, units: Sequence[int], prompts: Sequence[I32], contexts: Sequence[I32], capacity: int) -> None:
        self.drafts = self.make(max((len(p) for p in prompts), default=0) + capacity)
        self.last = [0] * len(units)
        for slot in reversed(range(len(units))):  # the highest slot first: per-slot state is sized once
            self._begin(slot, units[slot], prompts[slot], contexts[slot])
        self._catch_up([slot for slot, context in enumerate(contexts) if context.size])

    def restart(self, slot: int, unit: int, prompt: I32, context: I32) -> None:
        self.source.end(slot)
        self._begin(slot, unit, prompt, context)
        self.last[slot] = 0
        self._catch_up([slot] if context.size else [])

    def _catch_up(self, slots: list[int]) -> None:
        if self.catch_up and slots:
            self.source.propose(slots, len(self.last))

    def step(self, offsets: I64, tokens: I32, accepted: I32 | None) -> tuple[I64, I32, float]:
        source = self.source
        slots = list(range(offsets.size - 1))
        emitted = [tokens[offsets[i]: offsets[i + 1]].tolist() for i in slots]
        told = None if accepted is None else accepted.tolist()
        t0 = time.perf_counter()
        if told is not None:
            source.settle(slots, self.last, told, emitted)
        drafts = source.propose(slots, len(slots))
        elapsed = time.perf_counter() - t0
        self.last = [len(d) for d in drafts]
        for slot, n in zip(slots, self.last, strict=True):
            if n:
                name = source.source_of(slot)
                self.served[name] = self.served.get(name, 0) + 1
        out_off = np.zeros(len(slots) + 1, dtype=np.int64)
        np.cumsum(self.last, out=out_off[1:])
        flat = np.fromiter((t for d in drafts for t in d), dtype=np.int32, count=int(out_off[-1]))
        return out_off, flat, elapsed

    def close(self) -> None:
        if self.drafts is not None:
            for slot in range(len(self.last)):
                self.drafts.end(slot)
        self.drafts = None


def histospec(indexes: Sequence[HistoryIndex | None], knobs: SpeculationSpec, name: str = "histospec",
              groups: bool = False) -> EngineSource:
    """HistoSpec (`HistoryDrafts`) over unit u's history `indexes[u]` (None: it has none) and, with
    `groups`, each unit's group: its sequences' responses as they are replayed."""
    spec = knobs.model_copy(update={"group_drafts": groups})
    by_prompt = {str(u): index for u, index in enumerate(indexes) if index is not None}
    return EngineSource(name, spec, lambda width: HistoryDrafts(spec, by_prompt, None), catch_up=True)


def ngram(knobs: SpeculationSpec, name: str = "n-gram") -> EngineSource:
    """vLLM-style n-gram drafts (`NgramDrafts`) from each sequence's own context, `knobs`' AIMD window;
    the n-grams matched are the engine's (`NGRAM_MATCH`, the paper's 3 to 7), whatever `knobs.prefix` says."""
    return EngineSource(name, knobs, lambda width: NgramDrafts(knobs, None, width=width))


def fastest_of_n(sources: Sequence[EngineSource], knobs: SpeculationSpec, name: str = "fastest-of-n") -> EngineSource:
    """Fastest-of-N (`FastestOfNDrafts`) over `sources` in order of preference (ties go to the first),
    named by their names; its pass cap is a `DraftCapController` of `knobs` without a cost profile."""
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"fastest-of-n: its sources need distinct names, got {names}")
    return EngineSource(name, knobs, lambda width: FastestOfNDrafts({s.name: s.make(width) for s in sources},
                                                                    DraftCapController(knobs)))


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
