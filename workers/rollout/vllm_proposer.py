"""The job's drafting inside vLLM: a `custom_class` speculative proposer that adapts vLLM's calls to the
torch engine's draft sources (`DraftSource`: HistoSpec's `HistoryDrafts` with its group drafts, or
Fastest-of-N over history, n-gram and the draft model where the job names one), so drafting is
implemented once for both engines.

vLLM instantiates the class named in `speculative_config={"method": "custom_class", "model":
"rhymerl.workers.rollout.vllm_proposer.HistoryProposer", ...}` with its `VllmConfig` and calls
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)` once per engine step, one row per
running request. It passes no request ids, and rows are not stable: finished requests leave and
the rest are packed, preempted requests come back in other rows, and identical requests (greedy
samples of one prompt) are indistinguishable. So every row is identified by its content:

- its prompt, by matching the start of its tokens against the step's prompts (`set_step`, sent
  with the prompts' history indexes before the step's requests are added; the longest match
  wins when one prompt is a prefix of another);
- its drafting state (a slot of the step's draft source: the incremental suffix match and the AIMD
  window of RhymeRL §5.4, Fastest-of-N's scores), by the exact tokens the row had at the previous
  call. A row advances by 1..k+1 tokens per step (accepted draft tokens plus the one vLLM
  samples), so the state is found among the states keyed by one of those shorter lengths,
  compared token by token. A row whose state is not found (a new request) begins a fresh slot,
  settled with everything it generated so far (a request vLLM preempted and recomputed keeps its
  tokens, so it finds its state again). Slots live until the next `set_step`: one per request of
  the step.

What the previous draft achieved is read off the row itself: the accepted count is the common
prefix of the draft and the tokens appended since (vLLM's recovered token after a rejection never
equals the rejected draft token, its residual distribution gives it no mass); the source is told
it with the tokens the row gained (`DraftSource.settle`), as the torch engine tells it after a
verify pass. The per-pass cap is the torch engine's `DraftCapController`, fed each step's batch
size, the drafts on offer and what verification accepted, and priced from vLLM's own pass times
(`set_step(profile=...)`, workers/rollout/vllm_engine.py measures them); each step's cap and its
reason are counted in the step's stats (`ProposerStats.caps`), which a rollout call reads at its end.

With `freed_drafters` the job's source is wrapped as the torch engine wraps it (`RemoteDrafts`):
while a freed worker drafts for this one (`draft_from`), each row verifies its own method's draft
or the drafter's, whichever its tokens confirmed more, and the exchange with the drafter happens
once per engine step without waiting for its reply.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.drafting.cap_decisions import CapDecisions
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.model.transformer import TinyLlama, load_model
from rhymerl.workers.rollout.draft_link import DraftLink
from rhymerl.workers.rollout.engine import DraftSource
from rhymerl.workers.rollout.fastest_of_n import job_sources
from rhymerl.workers.rollout.generation import GenRequest, SourceCount
from rhymerl.workers.rollout.remote_drafts import RemoteDrafts
from rhymerl.workers.rollout.speculators import DraftCapController, HistoryDrafts

FILLER = 0
"""The token offered when measuring pass costs (the pad token of rhymerl's tokenizers: never sampled)."""
METHODS = ("history", "fastest-of-n")
"""The `speculation.method`s this proposer runs."""


@dataclass
class _Row:
    """Drafting state of one request, keyed by its tokens at the last call."""

    slot: int  # its slot in the step's draft source; -1: not one of the step's prompts
    length: int  # tokens (prompt + generated) at the last call
    draft: NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    source: str = ""  # the source of `draft`
    passes: int = 0  # engine steps that gave it tokens
    drafted: int = 0
    accepted: int = 0
    by_source: dict[str, SourceCount] = field(default_factory=dict)


@dataclass
class ProposerStats:
    """Counts since the last `set_step`: engine steps drafted for, rows, drafts, acceptance, and the
    draft cap of each step with its reason (the cap controller records into `caps`)."""

    calls: int = 0
    rows: int = 0
    drafted: int = 0
    accepted: int = 0
    matched_rows: int = 0
    """Rows whose state was found by content (the rest started fresh)."""
    fresh_rows: int = 0
    caps: CapDecisions = field(default_factory=CapDecisions)

    def as_dict(self) -> dict[str, int]:
        """The counts, the cap decisions among them (`CapDecisions.from_json` reads them back out)."""
        return {k: v for k, v in self.__dict__.items() if isinstance(v, int)} | self.caps.to_json()


RequestStats = tuple[int, int, int, dict[str, SourceCount]]
"""Of one finished request: engine steps, draft tokens offered, accepted, and those per source."""


class HistoryProposer:
    """vLLM `custom_class` proposer over the job's draft source (see the module docstring)."""

    def __init__(self, vllm_config: Any) -> None:
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.force = -1
        """>= 0: offer that many filler tokens on every row, history or not (cost measurement)."""
        self.prompts: dict[bytes, str] = {}  # the step's prompts -> their ids in the draft source
        self.lengths_desc: list[int] = []  # the step's prompt lengths, longest first
        self.rows: dict[tuple[int, bytes], list[_Row]] = {}  # (tokens held, their bytes) -> states
        self.lengths_held: dict[int, int] = {}  # states held per length (most lengths hold none)
        self.slots = 0  # slots begun this step
        self.ended: set[int] = set()  # slots of this step ended in the draft source (end_requests)
        self.stats = ProposerStats()
        self.draft_folder: str | None = None
        self.draft: TinyLlama | None = None
        self.configure(SpeculationSpec(), None)

    def configure(self, spec: SpeculationSpec, profile: CostProfile | None, draft: str | None = None) -> None:
        """Drafting knobs, the per-pass cost profile (None: AIMD windows only, capped at k) and, for
        Fastest-of-N, the draft model's folder (checked against the policy by the caller: job_settings):
        loaded here, in the process vLLM runs this proposer in, on that process's device."""
        if spec.method not in METHODS:
            raise ValueError(f"speculation.method {spec.method!r}: this proposer runs {', '.join(METHODS)}")
        self.spec = spec
        self.control = DraftCapController(spec, profile)
        if draft != self.draft_folder:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            self.draft = None if draft is None else load_model(Path(draft), torch.float32, device).eval()
            self.draft_folder = draft
        self._use(self._source({}))
        self.rows, self.lengths_held = {}, {}

    def _source(self, indexes: Mapping[str, HistoryIndex]) -> DraftSource:
        """The job's draft source over the step's indexes, as the torch engine builds it (Fastest-of-N
        with the draft model where one is configured)."""
        inner: DraftSource = job_sources(self.spec, indexes, self.control, self.draft) \
            if self.spec.method == "fastest-of-n" else HistoryDrafts(self.spec, indexes, self.control)
        return RemoteDrafts(self.spec, inner) if self.spec.freed_drafters else inner

    def _use(self, source: DraftSource) -> None:
        """Draft from `source` from now on; a drafter linked to the one before frees what it held."""
        before = getattr(self, "source", None)
        if isinstance(before, RemoteDrafts):
            before.attach(None)
        self.source: DraftSource = source

    def draft_from(self, link: DraftLink | None) -> bool:
        """Verify drafts from the freed drafter at the other end of `link` (None: from nobody) until
        the next `set_step` (the end of the call); False without freed drafters."""
        if not isinstance(self.source, RemoteDrafts):
            return False
        self.source.attach(link)
        return True

    def set_step(self, prompts: Sequence[Sequence[int]], indexes: Sequence[HistoryIndex | None]) -> None:
        """The prompts of the requests about to be generated and each one's history index (None: no
        history; group drafts only). Forgets every request and group of earlier steps."""
        if len(prompts) != len(indexes):
            raise ValueError(f"{len(prompts)} prompts, {len(indexes)} indexes")
        self.rows, self.lengths_held, self.stats, self.slots, self.ended = {}, {}, ProposerStats(), 0, set()
        self.control.decisions = self.stats.caps
        self.prompts = {np.asarray(t, dtype=np.int32).tobytes(): str(i) for i, t in enumerate(prompts)}
        self._use(self._source({str(i): index for i, index in enumerate(indexes) if index is not None}))
        self.lengths_desc = sorted({len(t) for t in prompts}, reverse=True)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM asks every proposer to load its model; ours need none."""

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
        drafting = [(i, r, a, start) for i, (r, a, start) in zip(live, found, strict=True)
                    if r.slot >= 0 and r.slot not in self.ended]  # an ended slot: a twin's, taken for its own
        if drafting:  # what each row's last draft achieved, and the tokens it gained since (all it generated, fresh)
            self._count([(r, a) for _, r, a, _ in drafting if a >= 0 and r.draft.size])
            self.source.settle([r.slot for _, r, _, _ in drafting],
                               [int(r.draft.size) if a >= 0 else 0 for _, r, a, _ in drafting],
                               [max(a, 0) for _, _, a, _ in drafting],
                               [token_ids_cpu[i, start:lengths[i]].tolist() for i, _, _, start in drafting])
        for i, (r, _, _) in zip(live, found, strict=True):
            r.draft = np.zeros(0, dtype=np.int32)
            r.passes += 1
            r.length = lengths[i]
            self.rows.setdefault((r.length, token_ids_cpu[i, :r.length].tobytes()), []).append(r)
            self.lengths_held[r.length] = self.lengths_held.get(r.length, 0) + 1
        if not drafting:
            return out
        drafts = self.source.propose([r.slot for _, r, _, _ in drafting], len(live))
        for (i, r, _, _), draft in zip(drafting, drafts, strict=True):
            room = max(0, min(self.k, self.max_model_len - lengths[i] - 1))
            if draft and room:
                r.draft = np.asarray(draft[:room], dtype=np.int32)
                r.source = self.source.source_of(r.slot)
                out[i] = r.draft.tolist()
        return out

    def _count(self, verified: list[tuple[_Row, int]]) -> None:
        """The counters of rows whose previous draft was verified: per request and source, and the step's."""
        for r, a in verified:
            d = int(r.draft.size)
            r.drafted += d
            r.accepted += a
            r.by_source.setdefault(r.source, SourceCount()).add(SourceCount(1, d, a))
            self.stats.drafted += d
            self.stats.accepted += a

    def end_requests(self, sequences: Sequence[Sequence[int]]) -> None:
        """Requests that finished or were handed back (prompt + response): their slots end in the draft
        source, so a freed drafter stops drafting for them. Only with freed drafters: the other sources
        keep nothing that costs a pass, and their slots end with the step."""
        if not isinstance(self.source, RemoteDrafts):
            return
        def live(r: _Row) -> bool:
            return r.slot >= 0 and r.slot not in self.ended

        for seq in sequences:
            tokens = np.asarray(seq, dtype=np.int32)
            state = self._state_of(tokens, live, ahead=False) or self._state_of(tokens, live, ahead=True)
            if state is not None:
                self.ended.add(state.slot)
                self.source.end(state.slot)

    def request_stats(self, sequences: Sequence[Sequence[int]]) -> list[RequestStats]:
        """(engine steps, draft tokens offered, accepted, those per source) of each finished request,
        given its prompt + response; (0, 0, 0, {}) for one not found. A state 1..k+1 tokens short of
        its request is counted with the request's pass after the proposer's last call (it accepted
        some of the state's draft and sampled one); one as long or longer (`_state_of`), as it is."""
        out: list[RequestStats | None] = [None] * len(sequences)
        taken: set[int] = set()
        every = [np.asarray(seq, dtype=np.int32) for seq in sequences]
        for ahead in (False, True):  # states behind first: a trimmed request must not take another's
            for i, tokens in enumerate(every):
                state = None if out[i] is not None else self._state_of(tokens, lambda r: id(r) not in taken, ahead)
                if state is not None:
                    taken.add(id(state))
                    out[i] = (state.passes, state.drafted, state.accepted, dict(state.by_source)) if ahead \
                        else self._with_last_pass(state, tokens[state.length:])
        return [o if o is not None else (0, 0, 0, {}) for o in out]

    def _with_last_pass(self, state: _Row, tail: NDArray[np.int32]) -> RequestStats:
        """A state's counts with the pass that verified its last draft and gave the request `tail`."""
        limit = min(state.draft.size, tail.size)
        mismatch = np.flatnonzero(state.draft[:limit] != tail[:limit])
        accepted = int(mismatch[0]) if mismatch.size else limit
        by_source = {n: replace(c) for n, c in state.by_source.items()}
        if state.draft.size:
            by_source.setdefault(state.source, SourceCount()).add(SourceCount(1, int(state.draft.size), accepted))
        return state.passes + 1, state.drafted + int(state.draft.size), state.accepted + accepted, by_source

    def _state_of(self, tokens: NDArray[np.int32], usable: Callable[[_Row], bool], ahead: bool) -> _Row | None:
        """The first `usable` state a request that ended with `tokens` left: one holding 1..k+1 tokens
        less (the request's last pass came after the proposer's last call) or, `ahead`, as many or up to
        k + 1 more (vLLM trimmed what followed a stop token; identical requests share a key)."""
        def first(states: Sequence[_Row]) -> _Row | None:
            return next((r for r in states if usable(r)), None)

        if not ahead:
            for length in range(tokens.size - 1, max(tokens.size - self.k - 2, 0), -1):
                if (state := first(self.rows.get((length, tokens[:length].tobytes()), ()))) is not None:
                    return state
            return None
        whole = tokens.tobytes()
        return next((state for (n, key), states in self.rows.items()
                     if tokens.size <= n <= tokens.size + self.k + 1 and key.startswith(whole)
                     and (state := first(states)) is not None), None)

    def _find(self, row: NDArray[np.integer[Any]], n: int) -> tuple[_Row, int, int]:
        """The state of the request in this row, how many tokens of its last draft were accepted (-1
        for a fresh state) and where the tokens it gained since begin."""
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
                return state, accepted, length
        self.stats.fresh_rows += 1
        return self._fresh(row, n)

    def _fresh(self, row: NDArray[np.integer[Any]], n: int) -> tuple[_Row, int, int]:
        for length in self.lengths_desc:
            if length <= n and (key := row[:length].tobytes()) in self.prompts:
                slot, self.slots = self.slots, self.slots + 1
                self.source.begin(slot, GenRequest(prompt_ids=row[:length].tolist(), sample_id=slot,
                                                   prompt_id=self.prompts[key]))
                return _Row(slot, length), -1, length
        return _Row(-1, n), -1, n
