"""Fastest-of-N in the torch engine: every draft source offers a draft each pass, and each sequence is
verified on the draft of the source its own emitted tokens confirmed most (SPECATOR's several
drafters, chosen per request; the choice rule is rhymerl/algorithms/drafting/fastest_of_n.py).

One `DraftCapController` caps the pass, priced on the chosen drafts, as for every other method; the
sources run without one and offer at their own AIMD windows. After verification every source is told
how much of its own draft the emitted tokens confirmed (`told_accepted`), so a source that was not
chosen keeps its window until its tokens are refuted and can take over when it keeps matching more.

A costly source (a draft model: k forward passes per draft) is asked only for the sequences that
would take its draft and, every PROBE_EVERY passes of a sequence, for the rest, so its score stays
current without paying for drafts nobody verifies; between asks its score is kept. A probe drafts
at most window.initial tokens (a couple of its steps, not a grown window's), and while the source
wins no paid lead its probes thin out: the gap doubles after each probe up to MAX_PROBE_GAP, as
the draft model's own probes do (a probe also catches its cache up on everything since the last). Where the source
prices its drafting (the draft model's measured steps), it is asked for the sequences it leads
only when the tokens its lead is expected to add outweigh the seconds it adds to the pass
(`costly_pays`): the one cap prices verification, not the drafting behind it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from rhymerl.algorithms.drafting.fastest_of_n import SourceChoice, costly_pays, matched, told_accepted
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout.draft_model import MAX_PROBE_GAP, DraftModelDrafts
from rhymerl.workers.rollout.engine import DraftSource
from rhymerl.workers.rollout.generation import GenRequest
from rhymerl.workers.rollout.group_drafts import GroupDrafts
from rhymerl.workers.rollout.speculators import PROBE_EVERY, DraftCapController, HistoryDrafts, NgramDrafts


class Costly(Protocol):
    """What Fastest-of-N needs of a source that costs model passes to ask (the draft model)."""

    def draft_seconds(self, slots: list[int]) -> float | None:
        """Seconds drafting for these slots would take now (None: not known yet)."""
        ...

    def probe(self, slots: list[int], batch_size: int) -> list[list[int]]:
        """Short drafts (at most window.initial tokens) for these slots: what a probe asks."""
        ...


class FastestOfNDrafts:
    """Several draft sources behind one; `sources` in order of preference (ties go to the first), those
    named in `costly` (each mapped to the source as a `Costly`) asked only where they lead and pay
    (module docstring), or on a probe."""

    def __init__(self, sources: Mapping[str, DraftSource], control: DraftCapController, decay: float = 0.8,
                 costly: Mapping[str, Costly] | None = None) -> None:
        if not sources:
            raise ValueError("fastest-of-n: needs at least one draft source")
        self.names = list(sources)
        self.sources = list(sources.values())
        self.costly = [(costly or {}).get(name) for name in self.names]
        self.probe_gap = [PROBE_EVERY] * len(self.sources)  # per costly source: passes of a sequence between probes
        self.paid = [False] * len(self.sources)  # per costly source: a lead of it paid since its last probe
        self.control = control
        self.choice = SourceChoice(0, len(self.sources), decay)
        self.offers: dict[int, list[list[int]]] = {}  # slot -> each source's draft of the last pass
        self.asked: dict[int, list[bool]] = {}  # slot -> which sources were asked for it in the last pass
        self.picked: dict[int, int] = {}  # slot -> the source its last verified draft came from
        self.passes: dict[int, int] = {}  # slot -> drafting passes since it began

    def begin(self, slot: int, request: GenRequest) -> None:
        if slot >= self.choice.scores.shape[0]:
            self.choice.resize(max(slot + 1, 2 * self.choice.scores.shape[0]))
        self.choice.reset(slot)
        self.passes[slot] = 0
        for source in self.sources:
            source.begin(slot, request)

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        for s in slots:
            self.offers.pop(s, None)
        if self.control.parked(batch_size):
            return [[] for _ in slots]
        rows = np.array(slots, dtype=np.int64)
        leading = self.choice.choose(rows)
        asked = np.ones((len(slots), len(self.sources)), dtype=np.bool_)
        offers = []
        for k, source in enumerate(self.sources):
            costly = self.costly[k]
            if costly is not None:
                lead = leading == k
                if lead.any() and not self._pays(costly, k, rows, lead, slots, batch_size):
                    lead[:] = False
                self.paid[k] |= bool(lead.any())
                probe = ~lead & np.array([self.passes[s] % self.probe_gap[k] == 0 for s in slots], dtype=np.bool_)
                if probe.any():
                    self.probe_gap[k] = PROBE_EVERY if self.paid[k] else min(2 * self.probe_gap[k], MAX_PROBE_GAP)
                    self.paid[k] = False
                asked[:, k] = lead | probe
                drafts: dict[int, list[int]] = {}
                for ask, which in ((source.propose, lead), (costly.probe, probe)):
                    mine = [s for s, yes in zip(slots, which, strict=True) if yes]
                    if mine:
                        drafts.update(zip(mine, ask(mine, batch_size), strict=True))
                offers.append([drafts.get(s, []) for s in slots])
            else:
                offers.append(source.propose(slots, batch_size))
        offered = np.array([[len(o[i]) > 0 for o in offers] for i in range(len(slots))], dtype=np.bool_)
        picks = self.choice.choose(rows, offered.reshape(len(slots), len(offers)))
        chosen = [offers[int(k)][i] for i, k in enumerate(picks)]
        for i, s in enumerate(slots):
            self.offers[s] = [o[i] for o in offers]
            self.asked[s] = asked[i].tolist()
            self.picked[s] = int(picks[i])
            self.passes[s] += 1
        cap = self.control.cap(batch_size, [len(c) for c in chosen])
        return [c[:cap] for c in chosen]

    def _pays(self, costly: Costly, k: int, rows: NDArray[np.int64], lead: NDArray[np.bool_], slots: list[int],
              batch_size: int) -> bool:
        """Whether costly source k pays for the rows it leads (`costly_pays`; unpriced: it does)."""
        profile = self.control.profile
        seconds = costly.draft_seconds([s for s, led in zip(slots, lead, strict=True) if led])
        if seconds is None or profile is None or len(self.sources) < 2:
            return True
        scores = self.choice.scores[rows]
        others = np.delete(scores, k, axis=1).max(axis=1)
        gain = float((scores[:, k] - others)[lead].sum())
        tokens = float(len(slots) + others.sum())
        return costly_pays(gain, tokens, profile.cost(batch_size, tokens / len(slots)), seconds)

    def settle(self, slots: list[int], drafted: list[int], accepted: list[int], emitted: list[list[int]]) -> None:
        self.control.observe(drafted, accepted)
        none: list[list[int]] = [[] for _ in self.sources]
        offers = [self.offers.get(s, none) for s in slots]
        scored = [i for i, o in enumerate(offers) if any(o)]
        if scored:
            confirmed = np.array([[matched(d, emitted[i]) for d in offers[i]] for i in scored], dtype=np.int64)
            asked = np.array([self.asked[slots[i]] for i in scored], dtype=np.bool_)
            self.choice.observe(confirmed, np.array([slots[i] for i in scored], dtype=np.int64), asked)
        for k, source in enumerate(self.sources):
            own = [o[k] for o in offers]
            source.settle(slots, [len(d) for d in own], [told_accepted(d, e) for d, e in zip(own, emitted, strict=True)],
                          emitted)

    def end(self, slot: int) -> None:
        for state in (self.offers, self.asked, self.picked, self.passes):
            state.pop(slot, None)
        for source in self.sources:
            source.end(slot)

    def move(self, src: list[int], dst: list[int]) -> None:
        self.choice.move(np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64))
        self.offers = {d: self.offers[s] for s, d in zip(src, dst, strict=True) if s in self.offers}
        self.asked = {d: self.asked[s] for s, d in zip(src, dst, strict=True) if s in self.asked}
        self.picked = {d: self.picked[s] for s, d in zip(src, dst, strict=True) if s in self.picked}
        self.passes = {d: self.passes[s] for s, d in zip(src, dst, strict=True) if s in self.passes}
        for source in self.sources:
            source.move(src, dst)

    def source_of(self, slot: int) -> str:
        return self.names[self.picked[slot]]


def job_sources(spec: SpeculationSpec, indexes: Mapping[str, HistoryIndex], control: DraftCapController,
                draft: TinyLlama | None = None, groups: GroupDrafts | None = None) -> FastestOfNDrafts:
    """`method: fastest-of-n` as a job runs it: history (with the group) and n-gram, plus the draft model
    where one is given, the draft model asked as a costly source."""
    sources: dict[str, DraftSource] = {"history": HistoryDrafts(spec, indexes, None, groups), "ngram": NgramDrafts(spec, None)}
    costly: dict[str, Costly] = {}
    if draft is not None:
        model = DraftModelDrafts(spec, draft, None, pricing=control)
        sources["draft-model"] = costly["draft-model"] = model
    return FastestOfNDrafts(sources, control, costly=costly)
