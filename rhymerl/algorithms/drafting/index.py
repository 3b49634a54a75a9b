"""HistoSpec's draft source: one prompt's previous-epoch responses, indexed for speculative decoding.

Why this exists: responses to a prompt change little from one epoch to the next (RhymeRL §5.1), so
last epoch's responses are drafts that cost no model. A history worker builds a `HistoryIndex` per
prompt (a reward-aware suffix automaton, native C++), ships it as bytes; a rollout worker binds each
generating sequence to its prompt's index in a `HistoryDrafter` and, every decoding step, gets the
drafts of the whole batch in one call (matching is incremental, O(1) per accepted token).

Drafting rule (§5.3, §5.4): match the longest suffix of the sequence, at most `prefix_max` tokens
long and at least `prefix_min`, that occurs in the history and has a continuation; then follow the
highest-priority branch, where a branch's priority is the number of responses through it (ties by
smaller token id), or with `reward_weighted=True` their summed reward (RhymeRL's rule: rewards
shifted so the worst weighs a small epsilon; ties by frequency; measured no better here,
benchmarks/reward-weighting); draft up to the sequence's AIMD window (start 2, +2 after a fully
accepted draft, back to 2 after any rejection, at most 32).
Data structure, format and numbers: docs/history-index.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from rhymerl.algorithms.drafting import _suffix_index as _native

if TYPE_CHECKING:
    from rhymerl.api.speculation import DraftWindowSpec, SpeculationSpec

IndexFormatError = _native.IndexFormatError
"""Raised for bytes that are not a valid serialised index (a subclass of ValueError)."""

FORMAT_VERSION: int = _native.FORMAT_VERSION
MAX_TOKENS: int = _native.MAX_TOKENS

Tokens = Sequence[int] | NDArray[np.integer[Any]]
Draft = tuple[NDArray[np.int64], NDArray[np.int32]]
"""Batched drafts: (offsets with len(handles) + 1 entries, concatenated draft tokens)."""


@dataclass(frozen=True)
class IndexStats:
    """Size of an index: what it holds and what it costs in memory and on the wire."""

    responses: int
    tokens: int
    states: int
    edges: int
    memory_bytes: int
    serialized_bytes: int

    @property
    def bytes_per_token(self) -> float:
        return self.memory_bytes / max(self.tokens, 1)


def _tokens(values: Tokens | ArrayLike) -> NDArray[np.int32]:
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int32)
    if arr.ndim != 1:
        raise ValueError(f"token ids must be one-dimensional, got shape {arr.shape}")
    if arr.dtype != np.int32:
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"token ids must be integers, got dtype {arr.dtype}")
        if arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max:
            raise ValueError("token ids must fit in int32")
        arr = arr.astype(np.int32)
    return np.ascontiguousarray(arr)


class HistoryIndex:
    """Immutable index over all responses of one prompt's previous rollout (safe to share by threads)."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.SuffixIndex) -> None:
        self._native = native

    @classmethod
    def build(cls, responses: Iterable[tuple[Tokens, float]], *, reward_weighted: bool = False) -> HistoryIndex:
        """Index (token_ids, reward) pairs; rewards must be finite, any sign."""
        seqs: list[NDArray[np.int32]] = []
        rewards: list[float] = []
        for tokens, reward in responses:
            seqs.append(_tokens(tokens))
            rewards.append(float(reward))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        if seqs:
            np.cumsum([len(s) for s in seqs], out=offsets[1:])
        flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int32)
        return cls.from_arrays(flat, offsets, np.asarray(rewards, dtype=np.float64), reward_weighted=reward_weighted)

    @classmethod
    def from_arrays(
        cls,
        tokens: ArrayLike,
        offsets: ArrayLike,
        rewards: ArrayLike,
        *,
        reward_weighted: bool = False,
    ) -> HistoryIndex:
        """Index responses given flat: response i is tokens[offsets[i]:offsets[i+1]] with rewards[i]."""
        return cls(
            _native.SuffixIndex.build(
                _tokens(tokens),
                np.asarray(offsets, dtype=np.int64),
                np.asarray(rewards, dtype=np.float64),
                reward_weighted,
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> HistoryIndex:
        """Load bytes from `to_bytes` without rebuilding; bad or truncated bytes raise IndexFormatError."""
        return cls(_native.SuffixIndex.from_bytes(data))

    def to_bytes(self) -> bytes:
        """Serialise (magic, version, CRC-32-checked; layout in docs/history-index.md)."""
        return self._native.to_bytes()

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        # Pickling (Ray object store, multiprocessing) goes through the checked byte format.
        return (HistoryIndex.from_bytes, (self.to_bytes(),))

    def draft(
        self,
        context: Tokens,
        max_tokens: int = 32,
        *,
        prefix_max: int = 7,
        prefix_min: int = 3,
        min_prob: float = 0.0,
    ) -> NDArray[np.int32]:
        """One-shot draft for a whole context (no AIMD state): the tokens the drafter would propose."""
        return self._native.draft(_tokens(context), max_tokens, prefix_max, prefix_min, min_prob)

    def priority(self, tokens: Tokens) -> tuple[int, int] | None:
        """(reward weight, occurrence count) of a token string in the history; None if it never occurs."""
        return self._native.priority(_tokens(tokens))

    def oracle_accepted(self, response: Tokens, prefix: int = 3) -> int:
        """RhymeRL §5.1's upper bound: tokens of `response` acceptable from this history with a
        `prefix`-token match and unlimited drafts (any history branch may be the one that fits)."""
        return self._native.oracle_accepted(_tokens(response), prefix)

    @property
    def reward_weighted(self) -> bool:
        return self._native.reward_weighted

    @property
    def n_responses(self) -> int:
        return self._native.n_responses

    @property
    def n_tokens(self) -> int:
        return self._native.n_tokens

    def stats(self) -> IndexStats:
        n = self._native
        return IndexStats(
            responses=n.n_responses,
            tokens=n.n_tokens,
            states=n.n_states,
            edges=n.n_edges,
            memory_bytes=n.memory_bytes,
            serialized_bytes=n.serialized_size,
        )

    def __repr__(self) -> str:
        return (
            f"HistoryIndex(responses={self.n_responses}, tokens={self.n_tokens}, "
            f"reward_weighted={self.reward_weighted})"
        )


class GroupIndex:
    """The current step's responses of one prompt's group, indexed while they are generated.

    Seer's grouped speculation: the siblings that run ahead draft for the rest, in every epoch,
    the first included. A bounded-depth suffix trie with occurrence counts (native); each token a
    sibling generates extends its `depth` newest suffixes by one node, so an update costs O(depth)
    and nothing is rebuilt. Sequences bound to it in a `HistoryDrafter` (`add(..., group=...)`)
    append their tokens as they are fed and draft from it and their history index, whichever
    matches the longer suffix. Belongs to one drafter; lives as long as anything refers to it.
    """

    __slots__ = ("_native",)

    def __init__(self, depth: int) -> None:
        """depth: longest string indexed, i.e. longest match plus draft (an RLJob: prefix.max + window.max)."""
        self._native = _native.GroupIndex(depth)

    @classmethod
    def for_spec(cls, spec: SpeculationSpec) -> GroupIndex:
        return cls(spec.prefix.max + spec.window.max)

    def extend(self, response: Tokens) -> None:
        """Index a whole response (one that no sequence of a drafter is generating)."""
        self._native.extend(_tokens(response))

    def follow(self) -> GroupFeed:
        """A response generated elsewhere (a sibling on another rollout worker), to append to as its
        tokens arrive."""
        return GroupFeed(self)

    @property
    def depth(self) -> int:
        return self._native.depth

    @property
    def n_nodes(self) -> int:
        return self._native.n_nodes

    @property
    def n_tokens(self) -> int:
        return self._native.n_tokens

    @property
    def memory_bytes(self) -> int:
        return self._native.memory_bytes

    def __repr__(self) -> str:
        return f"GroupIndex(depth={self.depth}, tokens={self.n_tokens}, nodes={self.n_nodes})"


class GroupFeed:
    """One response of a group that no sequence of this process generates, appended in order as
    its tokens arrive (each token costs what a generated one does: O(depth), nothing rebuilt)."""

    __slots__ = ("_native",)

    def __init__(self, group: GroupIndex) -> None:
        self._native = _native.GroupFeed(group._native)

    def append(self, tokens: Tokens) -> None:
        self._native.append(_tokens(tokens))

    @property
    def fed(self) -> int:
        """Tokens appended so far."""
        return self._native.fed


@dataclass(frozen=True)
class SequenceStats:
    """Per-sequence drafting counters, one entry per handle asked for."""

    window: NDArray[np.int64]
    match_length: NDArray[np.int64]
    drafted: NDArray[np.int64]
    accepted: NDArray[np.int64]
    rounds: NDArray[np.int64]


class AimdWindows:
    """Per-sequence AIMD draft windows (RhymeRL §5.4) for draft sources that keep no state of their
    own (n-gram, the benches' arctic); `HistoryDrafter` applies the same native rule inside.

    `windows[i]` is sequence i's window; `update` applies one verify round to every row: a fully
    accepted draft grows the window by `step` up to `max`, any rejection resets it to `initial`, a
    row that drafted nothing keeps it.
    """

    __slots__ = ("spec", "windows")

    def __init__(self, spec: DraftWindowSpec, n: int = 0) -> None:
        self.spec = spec
        self.windows = np.full(n, spec.initial, dtype=np.int32)

    def resize(self, n: int) -> None:
        """Keep the first n rows; new rows start at the initial window."""
        kept = self.windows[:n]
        self.windows = np.concatenate([kept, np.full(n - kept.size, self.spec.initial, dtype=np.int32)])

    def reset(self, row: int) -> None:
        self.windows[row] = self.spec.initial

    def update(self, drafted: ArrayLike, accepted: ArrayLike, rows: ArrayLike | None = None) -> None:
        """One verify round: `drafted[i]` tokens offered, `accepted[i]` of them accepted, for every
        row (or for `rows`, in that order)."""
        s = self.spec
        if rows is None:
            _native.aimd_update(self.windows, drafted, accepted, s.initial, s.step, s.max)
            return
        picked = np.asarray(rows, dtype=np.int64)
        part = np.ascontiguousarray(self.windows[picked])
        _native.aimd_update(part, drafted, accepted, s.initial, s.step, s.max)
        self.windows[picked] = part


def ngram_draft(contexts: NDArray[np.int32], lengths: ArrayLike, windows: ArrayLike, min_n: int,
                max_n: int) -> Draft:
    """vLLM-style n-gram (prompt lookup) drafts from each row's own context (`contexts[i, :lengths[i]]`):
    the longest suffix of min_n..max_n tokens seen earlier in the row (most recent occurrence among
    the longest), followed by up to windows[i] tokens. Native; the baseline HistoSpec is measured against."""
    return _native.ngram_draft(contexts, lengths, windows, min_n, max_n)


class HistoryDrafter:
    """Drafting state of the sequences one rollout worker is generating, driven in batches.

    Every call takes flat numpy arrays and does all per-sequence work in C++ with the GIL released.
    A typical engine iteration is one `step(handles, offsets, tokens, accepted)`: report how many
    tokens of each sequence's last draft were accepted (AIMD update), feed the tokens appended to
    each sequence (accepted draft tokens plus the one the model produced), get the next drafts.

    Its knobs are an RLJob's `rollout.speculation` block (`SpeculationSpec`, where each default is
    defined; `SpeculationSpec.paper_rule()` is the paper's). One option goes beyond the paper:
    `min_prob` ends a draft before a token whose path probability under the branch priorities
    (priority of the chosen child over its parent's, multiplied along the draft) drops below it:
    fewer rejections, so the AIMD window resets less often.
    """

    __slots__ = ("_native",)

    def __init__(self, spec: SpeculationSpec) -> None:
        self._native = _native.Drafter(spec.prefix.max, spec.prefix.min, spec.window.initial, spec.window.step,
                                       spec.window.max, spec.min_prob)

    def add(self, index: HistoryIndex | None, context: Tokens | None = None, *, group: GroupIndex | None = None) -> int:
        """Start drafting a sequence from its prompt's history `index`, its `group`, or both (at
        least one); `context` (e.g. tokens generated so far) is fed first, to the group as well.
        Every token fed to the sequence from then on is appended to the group."""
        if index is None and group is None:
            raise ValueError("a sequence drafts from a history index, a group index or both; got neither")
        ctx = _tokens(context) if context is not None else np.zeros(0, dtype=np.int32)
        return self._native.add(index._native if index is not None else None,
                                group._native if group is not None else None, ctx)

    def remove(self, handles: int | ArrayLike) -> None:
        """Forget finished sequences (their handles become invalid)."""
        self._native.remove(np.atleast_1d(np.asarray(handles, dtype=np.int64)))

    def feed(self, handles: ArrayLike, offsets: ArrayLike, tokens: ArrayLike) -> None:
        """Append tokens[offsets[i]:offsets[i+1]] to sequence handles[i]."""
        self._native.feed(handles, offsets, tokens)

    def report(self, handles: ArrayLike, accepted: ArrayLike) -> None:
        """Accepted prefix length of each sequence's last draft (0 <= accepted <= its length)."""
        self._native.report(handles, accepted)

    def draft(self, handles: ArrayLike, max_tokens: ArrayLike | None = None) -> Draft:
        """Drafts for every handle: (offsets, tokens) with draft i = tokens[offsets[i]:offsets[i+1]].

        max_tokens: optional per-handle caps on top of the AIMD window (tokens left before the
        length limit, an adaptive controller's limit); a fully accepted capped draft still counts
        as fully accepted."""
        return self._native.draft(handles, max_tokens)

    def step(
        self,
        handles: ArrayLike,
        offsets: ArrayLike,
        tokens: ArrayLike,
        accepted: ArrayLike | None = None,
        max_tokens: ArrayLike | None = None,
    ) -> Draft:
        """report(accepted) if given, then feed, then draft, in one native call."""
        return self._native.step(handles, offsets, tokens, accepted, max_tokens)

    def step_into(
        self,
        handles: ArrayLike,
        offsets: ArrayLike,
        tokens: ArrayLike,
        accepted: ArrayLike | None,
        out_offsets: NDArray[np.int64],
        out_tokens: NDArray[np.int32],
        max_tokens: ArrayLike | None = None,
    ) -> int:
        """`step` writing into caller-owned buffers (no allocation): out_offsets gets len(handles) + 1
        entries, out_tokens needs room for len(handles) * window_max tokens. Returns the draft count."""
        return self._native.step_into(handles, offsets, tokens, accepted, out_offsets, out_tokens, max_tokens)

    def stats(self, handles: ArrayLike) -> SequenceStats:
        table = self._native.inspect(handles)
        return SequenceStats(
            window=table[:, 0],
            match_length=table[:, 1],
            drafted=table[:, 2],
            accepted=table[:, 3],
            rounds=table[:, 4],
        )

    def __len__(self) -> int:
        return len(self._native)
