"""Draft sources the torch engine verifies: history (HistoSpec, with the group's own responses), n-gram
(own context), none.

Each keeps per-slot drafting state in step with what the engine emitted, and asks one shared
`DraftCapController` for the pass's draft cap, so the AIMD window of each sequence (RhymeRL §5.4)
runs underneath the cost-model cap (rhymerl/algorithms/drafting/adaptive_cap.py). Without a controller a source offers its drafts
at each sequence's own window and whoever combines sources caps them (fastest_of_n.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from rhymerl.algorithms.drafting.adaptive_cap import (
    AcceptanceTracker,
    CostCalibration,
    CostEvidence,
    CostProfile,
    choose_cap,
)
from rhymerl.algorithms.drafting.cap_decisions import DRAFTING, CapDecisions, Reason
from rhymerl.algorithms.drafting.index import (
    AimdWindows,
    HistoryDrafter,
    HistoryIndex,
    ngram_draft,
)
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.rollout.generation import GenRequest
from rhymerl.workers.rollout.group_drafts import GroupDrafts

PROBE_EVERY = 16


@dataclass
class DraftCapController:
    """Chooses each pass's draft cap from the cost profile and the acceptance seen so far.

    The time from one pass's choice to the next is that pass's real cost. With `evidence` it first
    corrects the profile's cells (adaptive.CostEvidence; `profile` then follows the corrected one);
    set against the (corrected) profile's prediction it calibrates the per-pass overhead
    (adaptive.CostCalibration). Without `evidence` the profile is taken as given.

    Switching off parks speculation: for the next few passes the draft source asks `parked()` first
    and, while it says so, runs the pass plain without drafting or choosing, so "off" costs what
    plain decoding costs (and the plain side of the calibration measures exactly that). Parks back
    off exponentially, 1, 2, 4, ... up to PROBE_EVERY - 1 passes while the choice stays 0, so a
    passing dip costs a pass or two and a lasting one costs almost nothing. A pass with no draft on
    offer chooses 0 without parking: sequences too young to match their history, or briefly off its
    paths, say nothing about whether drafts pay, and drafting resumes as soon as a match is back. A
    park ends early when the batch has halved or doubled, as the profile then prices drafts
    differently. A full-length park that ran its course is followed by a probe: if the choice is
    still 0, that pass drafts at the initial window anyway, so the acceptance estimate and the
    speculative side of the calibration stay current and speculation can switch itself back on.
    """

    spec: SpeculationSpec
    profile: CostProfile | None = None
    tracker: AcceptanceTracker = field(default_factory=AcceptanceTracker)
    calibration: CostCalibration = field(default_factory=CostCalibration)
    evidence: CostEvidence | None = None
    clock: Callable[[], float] = time.perf_counter
    profiled: Callable[[], bool] = lambda: True
    """Whether the pass being priced runs as the profile was measured (at its thread count): only
    such passes correct the profile's cells, which the cache keeps for that count."""
    passes: int = 0
    off_passes: int = 0
    probes: int = 0
    caps_chosen: dict[int, int] = field(default_factory=dict)
    decisions: CapDecisions = field(default_factory=CapDecisions)
    """Each pass's cap and why, by batch size, since they were last taken (`take_decisions`)."""
    _last: tuple[float, int, float, bool] | None = None  # previous pass: clock, batch, tokens per sequence, profiled
    _parked: int = 0        # passes left to run plain without asking the drafter
    _parked_at: int = 0     # the batch size when speculation was parked
    _park_len: int = 0      # length of the current park
    _backoff: int = 1       # length of the next park
    _probe_due: bool = False

    def parked(self, batch_size: int) -> bool:
        """Whether this pass runs plain without drafting; if so it is counted as an off pass."""
        if self._parked <= 0:
            return False
        if not self._parked_at / 2 < batch_size < self._parked_at * 2:
            self._parked = 0
            return False
        self._parked -= 1
        if self._parked == 0 and self._park_len == PROBE_EVERY - 1:
            self._probe_due = True
        self._record(batch_size, 0, [])
        self.decisions.record(batch_size, "parked")
        return True

    def cap(self, batch_size: int, lengths: Sequence[int] | None = None, *, priced_off: bool = False) -> int:
        """This pass's cap; `lengths` are the drafts on offer (see adaptive.choose_cap); `priced_off`:
        the source offers none because it priced its drafts off itself (the draft model's own steps),
        so the pass counts as `priced-off`, not `no-draft`."""
        limit = self.spec.window.max
        if self.evidence is not None:  # re-measured cells (verify_cost.ProfileStore) count from the next choice
            self.profile = self.evidence.profile
        fixed = self.spec.disable_above_batch is not None and batch_size > self.spec.disable_above_batch
        if fixed:
            cap = 0
        elif self.profile is None:
            cap = limit
        else:
            cap = choose_cap(self.profile, batch_size, self.tracker, lengths, limit=limit,
                             calibration=self.calibration)
        offered = lengths is None or any(lengths)
        probe = cap == 0 and self._probe_due and not fixed  # above disableAboveBatch nothing drafts, not even a probe
        if probe:
            cap = self.spec.window.initial
            self.probes += 1
        elif cap == 0 and offered:
            self._parked = self._park_len = self._backoff
            self._parked_at = batch_size
            self._backoff = min(2 * self._backoff, PROBE_EVERY - 1)
        elif cap > 0:
            self._backoff = 1
        self._probe_due = False
        drafts = [min(n, cap) for n in lengths] if lengths is not None else [cap] * batch_size
        reason = self._reason(fixed, offered, probe, cap, priced_off)
        self._record(batch_size, cap, drafts)
        self.decisions.record(batch_size, reason, cap if reason in DRAFTING else 0)
        return cap

    def _reason(self, fixed: bool, offered: bool, probe: bool, cap: int, priced_off: bool) -> Reason:
        """Why this pass got `cap`: a probe that drafts, the fixed rule, nothing on offer (the source's
        own price, or no draft), no profile, or the profile's choice, in that order."""
        if probe and offered:
            return "probe"
        if fixed:
            return "fixed-off"
        if not offered:
            return "priced-off" if priced_off else "no-draft"
        if self.profile is None:
            return "unpriced"
        return "priced" if cap > 0 else "priced-off"

    def take_decisions(self) -> CapDecisions:
        """The passes' caps and reasons since the last take (a rollout call's, at its end)."""
        taken, self.decisions = self.decisions, CapDecisions()
        return taken

    def _record(self, batch_size: int, cap: int, drafts: list[int]) -> None:
        """Count the pass; the previous one's time corrects the profile, then calibrates the overhead."""
        now = self.clock()
        if self._last is not None and self.profile is not None:
            start, batch, per_seq, profiled = self._last
            if self.evidence is not None and profiled:
                self.evidence.observe(batch, per_seq, now - start)
                self.profile = self.evidence.profile
            self.calibration.observe(per_seq > 1, now - start, self.profile.cost(batch, per_seq))
        self.passes += 1
        self.caps_chosen[cap] = self.caps_chosen.get(cap, 0) + 1
        self.off_passes += cap == 0
        if self.profile is not None and batch_size > 0:
            self._last = (now, batch_size, (batch_size + sum(drafts)) / batch_size, self.profiled())

    def observe(self, drafted: list[int], accepted: list[int]) -> None:
        pairs = [(d, a) for d, a in zip(drafted, accepted, strict=True) if d > 0]
        if pairs:
            self.tracker.observe([d for d, _ in pairs], [a for _, a in pairs])


class HistoryDrafts:
    """HistoSpec: drafts from the previous epoch's responses to the same prompt (native index) and,
    with `group_drafts`, from the responses of the prompt's group generated so far, by this source's
    engine and by siblings on other workers (`GroupDrafts`; a resumed sample's tokens join it when
    it is admitted).

    Emitted tokens are fed to the drafter lazily, in one native call just before it next drafts:
    while speculation is parked nothing is drafted, and the matcher catches up on the way back. A
    finishing or taken sequence's unfed tokens are fed before it is forgotten, so its group keeps them.
    """

    def __init__(self, spec: SpeculationSpec, indexes: Mapping[str, HistoryIndex],
                 control: DraftCapController | None, groups: GroupDrafts | None = None) -> None:
        """groups: the call's group indexes (the siblings it hears join them); None: its own, with
        `group_drafts`."""
        self.spec = spec
        self.drafter = HistoryDrafter(spec)
        self.indexes = indexes
        self.control = control
        self.groups = groups if groups is not None or not spec.group_drafts else GroupDrafts(spec)
        self.handle: dict[int, int] = {}  # slot -> drafter handle (prompts with history or a group)
        self.pending: dict[int, list[int]] = {}  # slot -> emitted tokens the drafter has not seen

    def begin(self, slot: int, request: GenRequest) -> None:
        index = self.indexes.get(request.prompt_id)
        group = self.groups.index(request.prompt_id) if self.groups is not None else None
        if index is not None or group is not None:
            self.handle[slot] = self.drafter.add(index, group=group)
            self.pending[slot] = []

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        if self.control is not None and self.control.parked(batch_size):
            return [[] for _ in slots]
        live = [s for s in slots if s in self.handle]
        if not live:
            if self.control is not None:
                self.control.cap(batch_size, [])
            return [[] for _ in slots]
        handles = np.array([self.handle[s] for s in live], dtype=np.int64)
        self._flush(live, handles)
        offsets, tokens = self.drafter.draft(handles)  # at each sequence's own AIMD window
        lengths = np.diff(offsets)
        cap = int(lengths.max()) if self.control is None else self.control.cap(batch_size, lengths.tolist())
        if cap == 0:  # nothing offered: settle() leaves these windows alone
            return [[] for _ in slots]
        if cap < int(lengths.max()):  # drafting again at the cap also tells the drafter what was offered
            offsets, tokens = self.drafter.draft(handles, np.full(len(live), cap, dtype=np.int32))
        drafts = {s: tokens[offsets[i]: offsets[i + 1]].tolist() for i, s in enumerate(live)}
        return [drafts.get(s, []) for s in slots]

    def _flush(self, live: list[int], handles: NDArray[np.int64]) -> None:
        chunks = [self.pending[s] for s in live]
        offsets = np.zeros(len(live) + 1, dtype=np.int64)
        np.cumsum([len(c) for c in chunks], out=offsets[1:])
        if offsets[-1]:
            flat = np.fromiter((t for c in chunks for t in c), dtype=np.int32, count=int(offsets[-1]))
            self.drafter.feed(handles, offsets, flat)
            for s in live:
                self.pending[s] = []

    def settle(self, slots: list[int], drafted: list[int], accepted: list[int], emitted: list[list[int]]) -> None:
        if self.control is not None:
            self.control.observe(drafted, accepted)
        verified = [i for i, s in enumerate(slots) if drafted[i] > 0 and s in self.handle]  # windows tested
        if verified:
            self.drafter.report(np.array([self.handle[slots[i]] for i in verified], dtype=np.int64),
                                np.array([accepted[i] for i in verified], dtype=np.int32))
        for s, toks in zip(slots, emitted, strict=True):
            if s in self.handle:
                self.pending[s] += toks

    def end(self, slot: int) -> None:
        handle = self.handle.pop(slot, None)
        pending = self.pending.pop(slot, None)
        if handle is not None:
            if pending and self.groups is not None:
                self.drafter.feed(np.array([handle], dtype=np.int64), np.array([0, len(pending)], dtype=np.int64),
                                  np.array(pending, dtype=np.int32))
            self.drafter.remove(handle)

    def source_of(self, slot: int) -> str:
        return "history"

    def move(self, src: list[int], dst: list[int]) -> None:
        self.handle = {d: self.handle[s] for s, d in zip(src, dst, strict=True) if s in self.handle}
        self.pending = {d: self.pending[s] for s, d in zip(src, dst, strict=True) if s in self.pending}


NGRAM_MATCH = (3, 7)
"""Shortest and longest n-gram the prompt-lookup baseline matches (vLLM's prompt_lookup_min/max).
Its own: the history knobs (`speculation.prefix`) fall back to 1-token matches, which pay only
with `min_prob` over a history's branch priorities, and a sequence's own context has none."""


class NgramDrafts:
    """vLLM-style n-gram (prompt lookup) drafts from each sequence's whole context (prompt and every
    token generated so far, as vLLM's proposer reads it), AIMD window.

    The contexts are one buffer of a row per slot; it starts `width` tokens wide and doubles when a
    sequence outgrows it, so a long response keeps matching its latest tokens. A pass over slots
    0..n-1 (the engine packs the tail into the lowest slots) hands the native matcher a view of the
    buffer, not a copy."""

    def __init__(self, spec: SpeculationSpec, control: DraftCapController | None, width: int = 2048,
                 match: tuple[int, int] = NGRAM_MATCH) -> None:
        if not 1 <= match[0] <= match[1]:
            raise ValueError(f"n-gram match {match}: need 1 <= shortest <= longest")
        if width < 1:
            raise ValueError(f"n-gram context width {width}: need at least 1")
        self.spec = spec
        self.control = control
        self.match = match
        self.context = np.zeros((0, width), dtype=np.int32)
        self.length: dict[int, int] = {}
        self.windows = AimdWindows(spec.window)

    def _fit(self, slot: int, tokens: int) -> None:
        """Room for `slot`'s row and for `tokens` tokens in it."""
        rows, width = self.context.shape
        if slot < rows and tokens <= width:
            return
        grown = np.zeros((max(rows, slot + 1), width if tokens <= width else max(tokens, 2 * width)), dtype=np.int32)
        grown[:rows, :width] = self.context
        self.context = grown
        if slot >= rows:
            self.windows.resize(slot + 1)

    def begin(self, slot: int, request: GenRequest) -> None:
        n = len(request.prompt_ids)
        self._fit(slot, n)
        self.context[slot, :n] = request.prompt_ids
        self.length[slot] = n
        self.windows.reset(slot)

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        if self.control is not None and self.control.parked(batch_size):
            return [[] for _ in slots]
        rows = np.array(slots, dtype=np.int64)
        lengths = np.array([self.length[s] for s in slots], dtype=np.int64)
        packed = np.array_equal(rows, np.arange(len(slots)))
        contexts = self.context[: len(slots)] if packed else self.context[rows]
        offsets, tokens = ngram_draft(contexts, lengths, self.windows.windows[rows], *self.match)
        cap = self.spec.window.max if self.control is None else self.control.cap(batch_size, np.diff(offsets).tolist())
        return [tokens[offsets[i]: min(offsets[i + 1], offsets[i] + cap)].tolist() for i in range(len(slots))]

    def settle(self, slots: list[int], drafted: list[int], accepted: list[int], emitted: list[list[int]]) -> None:
        if self.control is not None:
            self.control.observe(drafted, accepted)
        self.windows.update(drafted, accepted, rows=slots)
        for s, toks in zip(slots, emitted, strict=True):
            n = self.length[s]
            self._fit(s, n + len(toks))
            self.context[s, n: n + len(toks)] = toks
            self.length[s] = n + len(toks)

    def end(self, slot: int) -> None:
        self.length.pop(slot, None)

    def source_of(self, slot: int) -> str:
        return "ngram"

    def move(self, src: list[int], dst: list[int]) -> None:
        self.context[dst] = self.context[src]
        self.length = {d: self.length[s] for s, d in zip(src, dst, strict=True)}
        self.windows.windows[dst] = self.windows.windows[src]
