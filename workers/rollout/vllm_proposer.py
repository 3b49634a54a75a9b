"""HistoSpec inside vLLM: a `custom_class` speculative proposer that drafts from the previous epoch's
responses to each row's prompt.

vLLM instantiates the class named in `speculative_config={"method": "custom_class", "model":
"rhymerl.workers.rollout.vllm_proposer.HistoryProposer", ...}` with its `VllmConfig` and calls
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)` once per engine step, one row per
running request. It passes no request ids, and rows are not stable: finished requests leave and
the rest are packed, preempted requests come back in other rows, and identical requests (greedy
samples of one prompt) are indistinguishable. So every row is identified by its content:

- its prompt, by matching the start of its tokens against the step's prompts (`set_step`, sent
  with the prompts' history indexes before the step's requests are added; the longest match
  wins when one prompt is a prefix of another);
- its drafting state (a `HistoryDrafter` handle: the incremental suffix match and the AIMD window
  of RhymeRL §5.4), by the exact tokens the row had at the previous call. A row advances by
  1..k+1 tokens per step (accepted draft tokens plus the one vLLM samples), so the state is found
  among the states keyed by one of those shorter lengths, compared token by token. A row whose
  state is not found (a new request) starts a fresh state fed with everything it generated so
  far (a request vLLM preempted and recomputed keeps its tokens, so it finds its state again).
  States live until the next `set_step`: one per request of the step.

What the previous draft achieved is read off the row itself: the accepted count is the common
prefix of the draft and the tokens appended since (vLLM's recovered token after a rejection never
equals the rejected draft token, its residual distribution gives it no mass). The per-pass cap is
the torch engine's `DraftCapController`, fed each step's batch size, the drafts on offer and what
verification accepted, and priced from vLLM's own pass times (`set_step(profile=...)`,
workers/rollout/vllm_engine.py measures them).

With `group_drafts`, each prompt of the step also gets a `GroupIndex` that every request of that
prompt grows as its tokens are fed (so the group's requests draft for each other, from the first
epoch on), as in the torch engine.

Same index objects, same native drafter and the same knobs (`SpeculationSpec`) as the torch
engine's `HistoryDrafts`: nothing about drafting is implemented twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.drafting.index import GroupIndex, HistoryDrafter, HistoryIndex
from rhymerl.api.spec import SpeculationSpec
from rhymerl.workers.rollout.speculators import DraftCapController

FILLER = 0
"""The token offered when measuring pass costs (the pad token of rhymerl's tokenizers: never sampled)."""


@dataclass
class _Row:
    """Drafting state of one request, keyed by its tokens at the last call."""

    handle: int  # -1: nothing to draft from (no history nor group, or not one of the step's prompts)
    length: int  # tokens (prompt + generated) at the last call
    draft: NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    passes: int = 0  # engine steps that gave it tokens
    drafted: int = 0
    accepted: int = 0


@dataclass
class ProposerStats:
    """Counts since the last `set_step`: engine steps drafted for, rows, drafts, acceptance."""

    calls: int = 0
    rows: int = 0
    drafted: int = 0
    accepted: int = 0
    matched_rows: int = 0
    """Rows whose state was found by content (the rest started fresh)."""
    fresh_rows: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class HistoryProposer:
    """vLLM `custom_class` proposer over HistoSpec history indexes (see the module docstring)."""

    def __init__(self, vllm_config: Any) -> None:
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.force = -1
        """>= 0: offer that many filler tokens on every row, history or not (cost measurement)."""
        self.prompts: dict[bytes, HistoryIndex | None] = {}
        self.groups: dict[bytes, GroupIndex] = {}  # the step's prompts' groups (group_drafts)
        self.lengths_desc: list[int] = []  # the step's prompt lengths, longest first
        self.rows: dict[tuple[int, bytes], list[_Row]] = {}  # (tokens held, their bytes) -> states
        self.lengths_held: dict[int, int] = {}  # states held per length (most lengths hold none)
        self.stats = ProposerStats()
        self.configure(SpeculationSpec(), None)

    def configure(self, spec: SpeculationSpec, profile: CostProfile | None) -> None:
        """Drafting knobs and the per-pass cost profile (None: AIMD windows only, capped at k)."""
        self.spec = spec
        self.control = DraftCapController(spec, profile)
        self.drafter = HistoryDrafter(spec)
        self.rows, self.lengths_held = {}, {}

    def set_step(self, prompts: Sequence[Sequence[int]], indexes: Sequence[HistoryIndex | None]) -> None:
        """The prompts of the requests about to be generated and each one's history index (None: no
        history; group drafts only). Forgets every request and group of earlier steps."""
        if len(prompts) != len(indexes):
            raise ValueError(f"{len(prompts)} prompts, {len(indexes)} indexes")
        handles = [r.handle for states in self.rows.values() for r in states if r.handle >= 0]
        if handles:
            self.drafter.remove(np.asarray(handles, dtype=np.int64))
        self.rows, self.lengths_held, self.stats = {}, {}, ProposerStats()
        self.prompts = {np.asarray(t, dtype=np.int32).tobytes(): i for t, i in zip(prompts, indexes, strict=True)}
        self.groups = {key: GroupIndex.for_spec(self.spec) for key in self.prompts} if self.spec.group_drafts else {}
        self.lengths_desc = sorted({len(t) for t in prompts}, reverse=True)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM asks every proposer to load its model; history needs none."""

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: NDArray[np.integer[Any]],
                token_ids_cpu: NDArray[np.integer[Any]], slot_mappings: Any = None, **unused: Any) -> list[list[int]]:
        """One draft per row (empty: none); rows that sampled nothing this step (a prompt still being
        prefilled) or reached the model's length get none."""
        n_rows = len(sampled_token_ids)
        out: list[list[int]] = [[] for _ in range(n_rows)]
        self.stats.calls += 1
        lengths = [int(num_tokens_no_spec[i]) for i in range(n_rows)]
        if self.force >= 0:
            return [[FILLER] * max(0, min(self.force, self.k, self.max_model_len - n - 1)) if sampled_token_ids[i]
                    else [] for i, n in enumerate(lengths)]
        live = [i for i in range(n_rows) if sampled_token_ids[i] and lengths[i] < self.max_model_len]
        if not self.prompts or not live:
            return out
        found = [self._find(token_ids_cpu[i], lengths[i]) for i in live]
        self.stats.rows += len(live)
        self._settle(found)
        drafting = [(i, r) for i, (r, _) in zip(live, found, strict=True) if r.handle >= 0]
        handles = np.array([r.handle for _, r in drafting], dtype=np.int64)
        if drafting:  # the tokens each row gained since its last call (all it generated, for a fresh one)
            chunks = [token_ids_cpu[i, r.length:lengths[i]] for i, r in drafting]
            offsets = np.zeros(len(drafting) + 1, dtype=np.int64)
            np.cumsum([c.size for c in chunks], out=offsets[1:])
            if offsets[-1]:
                self.drafter.feed(handles, offsets, np.concatenate(chunks).astype(np.int32, copy=False))
        for i, (r, _) in zip(live, found, strict=True):
            r.draft = np.zeros(0, dtype=np.int32)
            r.passes += 1
            r.length = lengths[i]
            self.rows.setdefault((r.length, token_ids_cpu[i, :r.length].tobytes()), []).append(r)
            self.lengths_held[r.length] = self.lengths_held.get(r.length, 0) + 1

        batch = len(live)
        if not drafting or self.control.parked(batch):
            return out
        room = np.array([max(0, min(self.k, self.max_model_len - lengths[i] - 1)) for i, _ in drafting], dtype=np.int32)
        offsets, tokens = self.drafter.draft(handles, room)  # each row at its own AIMD window
        offered = np.diff(offsets)
        cap = self.control.cap(batch, offered.tolist())
        if cap == 0:
            return out
        if cap < int(offered.max()):  # drafting again at the cap also tells the drafter what was offered
            offsets, tokens = self.drafter.draft(handles, np.minimum(room, cap))
        for j, (i, r) in enumerate(drafting):
            r.draft = tokens[offsets[j]:offsets[j + 1]].copy()
            out[i] = r.draft.tolist()
        return out

    def _settle(self, found: list[tuple[_Row, int]]) -> None:
        """What each row's previous draft achieved: to the drafter (its AIMD window), the cap's
        acceptance estimate and the counters."""
        verified = [(r, a) for r, a in found if r.handle >= 0 and r.draft.size and a >= 0]
        if not verified:
            return
        drafted = [int(r.draft.size) for r, _ in verified]
        accepted = [a for _, a in verified]
        self.drafter.report(np.array([r.handle for r, _ in verified], dtype=np.int64),
                            np.array(accepted, dtype=np.int32))
        self.control.observe(drafted, accepted)
        self.stats.drafted += sum(drafted)
        self.stats.accepted += sum(accepted)
        for (r, a), d in zip(verified, drafted, strict=True):
            r.drafted += d
            r.accepted += a

    def request_stats(self, sequences: Sequence[Sequence[int]]) -> list[tuple[int, int, int]]:
        """(engine steps, draft tokens offered, accepted) of each finished request, given its prompt
        + response; (0, 0, 0) for one not found. The request's pass after the last call to the
        proposer is counted too: its state holds 1..k+1 tokens less than the request (the pass
        accepted some of the state's draft and sampled one), or, where vLLM trimmed what followed a
        stop token, up to k + 1 tokens more."""
        out = [(0, 0, 0)] * len(sequences)
        taken: set[int] = set()
        left: dict[bytes, list[int]] = {}
        for i, seq in enumerate(sequences):
            tokens = np.asarray(seq, dtype=np.int32)
            for length in range(tokens.size - 1, max(tokens.size - self.k - 2, 0), -1):
                state = next((r for r in self.rows.get((length, tokens[:length].tobytes()), ())
                              if id(r) not in taken), None)
                if state is not None:
                    taken.add(id(state))
                    tail = tokens[length:]
                    limit = min(state.draft.size, tail.size)
                    mismatch = np.flatnonzero(state.draft[:limit] != tail[:limit])
                    accepted = int(mismatch[0]) if mismatch.size else limit
                    out[i] = (state.passes + 1, state.drafted + int(state.draft.size), state.accepted + accepted)
                    break
            else:  # identical requests (greedy twins) share a key
                left.setdefault(tokens.tobytes(), []).append(i)
        item = np.dtype(np.int32).itemsize
        for (n, key), states in self.rows.items():
            for length in range(max(n - self.k - 1, 1), n + 1):
                waiting = left.get(key[: length * item])
                if waiting:
                    for state in states:
                        if waiting and id(state) not in taken:
                            out[waiting.pop()] = (state.passes, state.drafted, state.accepted)
                    break
        return out

    def _find(self, row: NDArray[np.integer[Any]], n: int) -> tuple[_Row, int]:
        """The state of the request in this row and how many tokens of its last draft were accepted
        (-1 for a fresh state)."""
        for gained in range(1, self.k + 2):
            length = n - gained
            if length <= 0:
                break
            if not self.lengths_held.get(length):
                continue
            key = (length, row[:length].tobytes())
            candidates = self.rows.get(key)
            if candidates:
                state = candidates.pop()
                if not candidates:
                    del self.rows[key]
                self.lengths_held[length] -= 1
                self.stats.matched_rows += 1
                new = row[length:n]
                limit = min(state.draft.size, new.size)
                mismatch = np.flatnonzero(state.draft[:limit] != new[:limit])
                accepted = int(mismatch[0]) if mismatch.size else limit
                return state, accepted
        self.stats.fresh_rows += 1
        return self._fresh(row, n), -1

    def _fresh(self, row: NDArray[np.integer[Any]], n: int) -> _Row:
        for length in self.lengths_desc:
            if length <= n and (key := row[:length].tobytes()) in self.prompts:
                index, group = self.prompts[key], self.groups.get(key)
                if index is None and group is None:
                    return _Row(-1, length)
                return _Row(self.drafter.add(index, group=group), length)
        return _Row(-1, n)
