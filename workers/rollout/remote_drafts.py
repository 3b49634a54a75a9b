"""Drafts made on another rollout worker (SPECATOR §4: drafters on the GPUs a round's tail frees).

In a round's tail most rollout workers hold nothing while a few run the stragglers. The controller
pairs a freed worker with a straggling one (rhymerl.algorithms.scheduling.freed_drafters decides,
workers/controller/fleet.py carries it out); the straggling worker, the verifier, then sends what
its sequences emitted to the freed one, the drafter, which runs the job's draft model over them and
sends back, per sequence, a stream of greedy tokens predicted to follow what it had heard. The
verifier verifies those drafts as it verifies its own (tokens stay plain decoding's).

Drafting and verification are decoupled: the verifier never waits for the drafter. Each pass it
takes the drafter's latest reply if one has come, sends what was emitted since its last message if
none is outstanding, and drafts every sequence from the stream it holds: the tokens the stream
predicted beyond the sequence's current length, when the tokens emitted since the stream's base are
the ones the stream predicted there. A late or lost reply costs drafts, never tokens. Streams come
from a draft model at its own AIMD window, told as accepted what the verifier's tokens confirmed, so
a drafter whose guesses keep matching runs further ahead and covers a reply's delay.

Per sequence the verifier verifies whichever of the two drafts, its own method's or the drafter's,
the sequence's own emitted tokens confirmed more (Best-of-N over the two, by Fastest-of-N's rule and
`SourceChoice`: a decayed mean of confirmed tokens per pass, ties to its own method). Both cost the
verifier nothing to make, so both are offered every pass and both are scored: its own method's
drafts start in front (they measured the best accepted where there is history, benchmarks/
fastest-of-n), the drafter's fill the passes where its own method drafts nothing (HistoSpec before
a sequence matches its history, a parked pass), and take over a sequence whose tokens they keep
predicting better (a prompt whose history has little to say, the first epoch).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from rhymerl.algorithms.drafting.fastest_of_n import SourceChoice, matched, told_accepted
from rhymerl.algorithms.drafting.index import AimdWindows
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout.draft_link import DraftLink, DraftStream, News
from rhymerl.workers.rollout.draft_model import DraftModelDrafts
from rhymerl.workers.rollout.engine import DraftSource
from rhymerl.workers.rollout.generation import GenRequest

SOURCE = "freed-drafter"
"""The source name the verifier's remote drafts are counted under (dumps, `spec_sources`)."""


class DraftServer:
    """The drafter's end of one link: a draft model's state per sequence the verifier runs."""

    def __init__(self, spec: SpeculationSpec, model: TinyLlama) -> None:
        self.drafts = DraftModelDrafts(spec, model, None)
        self.slots: dict[int, int] = {}  # verifier's sequence -> slot in the draft model's cache
        self.free: list[int] = []
        self.length: dict[int, int] = {}  # tokens of the sequence's context heard of
        self.last: dict[int, list[int]] = {}  # the stream sent last, not yet confirmed or refuted

    @torch.inference_mode()
    def exchange(self, news: Sequence[News]) -> list[DraftStream]:
        """Take the news, then draft for every sequence still running: a stream for each."""
        for n in news:
            if n.ended:
                self._end(n.seq)
                continue
            if n.seq not in self.slots:
                if n.prompt is None:  # its first news was lost with an earlier message: nothing to draft from
                    continue
                slot = self.free.pop() if self.free else len(self.slots)
                self.slots[n.seq] = slot
                self.drafts.begin(slot, GenRequest(list(n.prompt), n.seq))
                self.length[n.seq], self.last[n.seq] = len(n.prompt), []
            if n.tokens:
                slot, last = self.slots[n.seq], self.last[n.seq]
                self.drafts.settle([slot], [len(last)], [told_accepted(last, n.tokens)], [list(n.tokens)])
                self.length[n.seq] += len(n.tokens)
                self.last[n.seq] = []
        seqs = sorted(self.slots)
        if not seqs:
            return []
        proposals = self.drafts.propose([self.slots[q] for q in seqs], len(seqs))
        for q, p in zip(seqs, proposals, strict=True):
            self.last[q] = list(p)
        return [DraftStream(q, self.length[q], tuple(p)) for q, p in zip(seqs, proposals, strict=True) if p]

    def _end(self, seq: int) -> None:
        slot = self.slots.pop(seq, None)
        if slot is not None:
            self.drafts.end(slot)
            self.free.append(slot)
        self.length.pop(seq, None)
        self.last.pop(seq, None)


@dataclass
class _Seq:
    seq: int
    context: list[int]
    unsent: list[int] = field(default_factory=list)
    announced: bool = False  # the drafter has heard its prompt


OWN, THEIRS = 0, 1
"""The two draft sources a verifier chooses between per sequence: its own method's and the drafter's."""


class RemoteDrafts:
    """The verifier's draft source: per sequence, `inner`'s drafts (the job's own method; None: none) or,
    while a drafter is linked (`attach`), the drafter's, whichever the sequence's tokens confirmed more
    (module docstring)."""

    def __init__(self, spec: SpeculationSpec, inner: DraftSource | None) -> None:
        self.inner = inner
        self.windows = AimdWindows(spec.window)
        self.link: DraftLink | None = None
        self.ids = itertools.count()
        self.seqs: dict[int, _Seq] = {}  # slot -> its sequence
        self.ended: list[int] = []  # sequences ended since the last message
        self.streams: dict[int, DraftStream] = {}  # sequence -> the latest stream the drafter sent
        self.remote: dict[int, bool] = {}  # slot -> whether its last proposal was the drafter's
        self.choice = SourceChoice(0, 2)  # per slot: scores of OWN and THEIRS
        self.offers: dict[int, tuple[list[int], list[int]]] = {}  # slot -> (own draft, drafter's) of the last pass
        self.waiting = False  # a message is outstanding
        self.messages = 0  # replies taken
        self.failed: str | None = None  # why the last link broke

    def attach(self, link: DraftLink | None) -> None:
        """Draft from `link` from now on (None: from nobody but `inner`)."""
        if self.link is not None:
            try:
                self.link.close()
            except Exception as exc:  # a drafter that is gone has nothing left to free
                self.failed = f"{type(exc).__name__}: {exc}"
        self.link, self.waiting = link, False
        self.streams.clear()
        self.ended.clear()
        for s in self.seqs.values():  # a new drafter hears every sequence whole
            s.announced, s.unsent = False, []

    # ------------------------------------------------------------------ DraftSource
    def begin(self, slot: int, request: GenRequest) -> None:
        if self.inner is not None:
            self.inner.begin(slot, request)
        if slot >= self.windows.windows.size:
            self.windows.resize(max(slot + 1, 2 * self.windows.windows.size))
        if slot >= self.choice.scores.shape[0]:
            self.choice.resize(max(slot + 1, 2 * self.choice.scores.shape[0]))
        self.windows.reset(slot)
        self.choice.reset(slot)
        self.seqs[slot] = _Seq(next(self.ids), list(request.prompt_ids))
        self.remote[slot] = False

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        own = self.inner.propose(slots, batch_size) if self.inner is not None else [[] for _ in slots]
        for s in slots:
            self.offers.pop(s, None)
        if self.link is None:
            for s in slots:
                self.remote[s] = False
            return own
        self._talk()
        theirs = [self._from_stream(s) for s in slots]
        offered = np.array([[bool(o), bool(t)] for o, t in zip(own, theirs, strict=True)], dtype=np.bool_)
        picks = self.choice.choose(np.array(slots, dtype=np.int64), offered.reshape(len(slots), 2))
        out = []
        for s, o, t, pick in zip(slots, own, theirs, picks, strict=True):
            self.offers[s] = (o, t)
            self.remote[s] = pick == THEIRS and bool(t)
            out.append(t if self.remote[s] else o)
        return out

    def settle(self, slots: list[int], drafted: list[int], accepted: list[int], emitted: list[list[int]]) -> None:
        """Each source is told what its own draft achieved: the verified one what verification accepted,
        the other what the emitted tokens confirmed of it (`told_accepted`), as Fastest-of-N tells its
        sources; the choice scores both."""
        own_drafted, own_accepted = [], []
        rows, their_drafted, their_accepted = [], [], []
        scored, confirmed = [], []
        for s, d, a, e in zip(slots, drafted, accepted, emitted, strict=True):
            own, theirs = self.offers.get(s, ([], []))
            if self.remote.get(s):
                own_drafted.append(len(own))
                own_accepted.append(told_accepted(own, e))
                rows.append(s)
                their_drafted.append(d)
                their_accepted.append(a)
            else:
                own_drafted.append(d)
                own_accepted.append(a)
                if theirs:
                    rows.append(s)
                    their_drafted.append(len(theirs))
                    their_accepted.append(told_accepted(theirs, e))
            if own or theirs:
                scored.append(s)
                confirmed.append((matched(own, e), matched(theirs, e)))
        if self.inner is not None:
            self.inner.settle(slots, own_drafted, own_accepted, emitted)
        if rows:
            self.windows.update(their_drafted, their_accepted, rows=rows)
        if scored:
            self.choice.observe(np.array(confirmed, dtype=np.int64), np.array(scored, dtype=np.int64))
        for s, toks in zip(slots, emitted, strict=True):
            seq = self.seqs[s]
            seq.context += toks
            seq.unsent += toks

    def end(self, slot: int) -> None:
        if self.inner is not None:
            self.inner.end(slot)
        seq = self.seqs.pop(slot, None)
        self.remote.pop(slot, None)
        self.offers.pop(slot, None)
        if seq is not None:
            self.streams.pop(seq.seq, None)
            if seq.announced:
                self.ended.append(seq.seq)

    def move(self, src: list[int], dst: list[int]) -> None:
        if self.inner is not None:
            self.inner.move(src, dst)
        pairs = [(s, d) for s, d in zip(src, dst, strict=True) if s in self.seqs]
        self.seqs = {d: self.seqs[s] for s, d in pairs}
        self.remote = {d: self.remote.get(s, False) for s, d in pairs}
        self.offers = {d: self.offers[s] for s, d in pairs if s in self.offers}
        if pairs:
            self.windows.windows[[d for _, d in pairs]] = self.windows.windows[[s for s, _ in pairs]]
            self.choice.move(np.array([s for s, _ in pairs], dtype=np.int64), np.array([d for _, d in pairs],
                                                                                        dtype=np.int64))

    def source_of(self, slot: int) -> str:
        if self.remote.get(slot) or self.inner is None:
            return SOURCE
        return self.inner.source_of(slot)

    # ------------------------------------------------------------------ the link
    def _talk(self) -> None:
        """Take the drafter's reply if it has come; send the news if no message is outstanding."""
        assert self.link is not None
        try:
            if self.waiting:
                reply = self.link.poll()
                if reply is None:
                    return
                self.waiting = False
                self.messages += 1
                live = {s.seq for s in self.seqs.values()}
                self.streams.update((st.seq, st) for st in reply if st.seq in live)
            news = [News(q, ended=True) for q in self.ended]
            for s in self.seqs.values():
                if not s.announced:
                    news.append(News(s.seq, prompt=tuple(s.context)))
                    s.announced = True
                elif s.unsent:
                    news.append(News(s.seq, tokens=tuple(s.unsent)))
                s.unsent = []
            self.ended = []
            self.link.send(news)
            self.waiting = True
        except Exception as exc:  # whatever broke the link (a dead actor, a lost pod), the verifier goes on
            self.failed = f"{type(exc).__name__}: {exc}"
            self.link = None
            self.waiting = False
            self.streams.clear()

    def _from_stream(self, slot: int) -> list[int]:
        """The drafter's prediction of what follows the sequence now, up to its window (module docstring)."""
        seq = self.seqs[slot]
        stream = self.streams.get(seq.seq)
        if stream is None:
            return []
        ahead = len(seq.context) - stream.base
        if ahead < 0 or ahead >= len(stream.tokens) or \
                matched(stream.tokens[:ahead], seq.context[stream.base:]) < ahead:
            return []
        return list(stream.tokens[ahead: ahead + int(self.windows.windows[slot])])
