"""The round book: one record per sample of a rollout fleet's rounds, so that one place answers
"where is sample X, and in what state?" and every part of the fleet reads the same state.

A fleet names its samples by its own key (the rollout fleet's `SampleRef`, opaque here) and the
scheduler by its `SampleId`; the book maps the two. A sample is held by at most one running call
(a holder: the fleet's call id) with the tokens that call last reported for it, may have a move
asked for it (a request not yet answered), may be parked in the fleet's hands (deferred to a later
round, or handed back by a worker that left or died, until it gets a place), may be watched (the
scheduler wants to hear when it reaches a token count), and counts how often it lost its worker.
Pure: no I/O, no clock; the fleet (workers/controller/) drives the transitions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from .types import Move, SampleId

K = TypeVar("K")
"""The fleet's name for a sample."""
R = TypeVar("R")
"""Where a sample's tokens so far are (what a call resumes it from)."""
P = TypeVar("P")
"""What the fleet keeps of a parked sample."""

State = Literal["queued", "running", "moving", "parked", "handed_back", "finished", "unknown"]
"""queued: in a call, no token reported yet; running: in a call with tokens; moving: a move asked
of its call, not answered; parked: deferred to a later round; handed_back: in the fleet's hands
(its worker left or died), waiting for a place in its round; finished: its call reported its length."""


@dataclass
class Held(Generic[R]):
    """A sample as the call holding it knows it."""

    resume: R | None = None  # where its tokens so far are (None: it started afresh)
    resumed: int = 0  # how many tokens that is


@dataclass
class Record:
    """One sample's place in the book."""

    sid: SampleId | None = None  # the scheduler's id (None: its books closed, or never opened)
    holder: int | None = None  # the call running it
    watch: int | None = None  # tokens the scheduler waits for
    move: Move | None = None  # a move asked of its call, not answered yet
    deferred: bool = False  # parked for a later round (else: waiting for a place in its own)
    told: bool = False  # the scheduler heard it finish
    losses: int = 0  # how often its worker died under it


@dataclass
class _Holding(Generic[K, R]):
    samples: dict[K, Held[R]] = field(default_factory=dict)  # in the order the call took them
    tokens: dict[K, int] = field(default_factory=dict)  # unfinished ones, as last reported
    finished: dict[K, int] = field(default_factory=dict)  # lengths the call reported


@dataclass(frozen=True)
class Where:
    """Where a sample is, in what state."""

    state: State
    sid: SampleId | None
    holder: int | None
    tokens: int
    watch: int | None
    losses: int


class RoundBook(Generic[K, R, P]):
    """Every sample a fleet tracks, by its key and by its scheduler id."""

    def __init__(self) -> None:
        self._records: dict[K, Record] = {}
        self._keys: dict[SampleId, K] = {}
        self._parked: dict[K, P] = {}  # in the order parked
        self._holdings: dict[int, _Holding[K, R]] = {}
        self._next_sid = 0

    # ------------------------------------------------------------------ ids
    def open(self, key: K) -> SampleId:
        """A fresh sample: its scheduler id (a new one each time a key is opened)."""
        sid, self._next_sid = self._next_sid, self._next_sid + 1
        self._record(key).sid = sid
        self._keys[sid] = key
        return sid

    def sid(self, key: K) -> SampleId | None:
        r = self._records.get(key)
        return None if r is None else r.sid

    def key(self, sid: SampleId) -> K:
        return self._keys[sid]

    def forget(self, key: K) -> None:
        """Its group trained: its scheduler id, watch, finish and losses are dropped."""
        r = self._records.get(key)
        if r is None:
            return
        if r.sid is not None:
            del self._keys[r.sid]
        r.sid, r.watch, r.told, r.losses = None, None, False, 0
        self._tidy(key)

    # ------------------------------------------------------------------ calls holding samples
    def hold(self, holder: int, key: K, resume: R | None, resumed: int, tokens: int | None = None) -> None:
        """Call `holder` takes `key`, resuming from `resume` (`resumed` tokens); `tokens`: its count
        in the call's report book (None: not counted until the call reports)."""
        held = self._holdings.setdefault(holder, _Holding())
        held.samples[key] = Held(resume, resumed)
        if tokens is not None:
            held.tokens[key] = tokens
        self._record(key).holder = holder

    def release(self, holder: int, keys: Iterable[K]) -> None:
        """The call handed these samples back (its record of them goes)."""
        held = self._holdings.get(holder)
        for key in keys:
            if held is not None:
                held.samples.pop(key, None)
                held.tokens.pop(key, None)
            r = self._records.get(key)
            if r is not None and r.holder == holder:
                r.holder = None
                self._tidy(key)

    def close(self, holder: int) -> None:
        """The call ended: it holds nothing any more."""
        held = self._holdings.pop(holder, None)
        for key in held.samples if held is not None else ():
            r = self._records.get(key)
            if r is not None and r.holder == holder:
                r.holder = None
                self._tidy(key)

    def holds(self, holder: int, key: K) -> bool:
        return key in self._holding(holder).samples

    def held(self, holder: int) -> Mapping[K, Held[R]]:
        """What the call holds, in the order it took them."""
        return self._holding(holder).samples

    def tokens(self, holder: int) -> Mapping[K, int]:
        """The call's unfinished samples with their tokens, as it last reported them."""
        return self._holding(holder).tokens

    def report(self, holder: int, running: Mapping[K, int]) -> None:
        """The call reported these running samples' tokens (samples it does not hold are ignored)."""
        held = self._holding(holder)
        held.tokens = {k: n for k, n in running.items() if k in held.samples}

    def snapshot(self, holder: int, key: K, resume: R, resumed: int) -> None:
        """The call's sample can be resumed from `resume` with `resumed` tokens."""
        held = self._holding(holder).samples.get(key)
        if held is not None:
            held.resume, held.resumed = resume, resumed

    def finish(self, holder: int, key: K, length: int) -> bool:
        """The call reported the sample finished; False if it had already."""
        holding = self._holdings.setdefault(holder, _Holding())
        if key in holding.finished:
            return False
        holding.finished[key] = length
        holding.tokens.pop(key, None)
        return True

    def finished(self, holder: int, key: K) -> bool:
        """Whether the call reported the sample finished."""
        return key in self._holding(holder).finished

    def tell(self, key: K) -> SampleId | None:
        """The sample's finish for the scheduler: its id the first time (None after, or without one)."""
        r = self._records.get(key)
        if r is None or r.sid is None or r.told:
            return None
        r.told = True
        return r.sid

    def told(self, key: K) -> bool:
        r = self._records.get(key)
        return r is not None and r.told

    def unfinished(self, holders: Sequence[int]) -> list[tuple[SampleId, int]]:
        """The executor's `Fleet.unfinished` over these calls, in order: each call's samples with a
        scheduler id whose finish it has not heard and that no move is asked for, with their tokens."""
        out: list[tuple[SampleId, int]] = []
        for h in holders:
            for key, n in self._holding(h).tokens.items():
                r = self._records.get(key)
                if r is not None and r.sid is not None and r.move is None and not r.told:
                    out.append((r.sid, n))
        return out

    # ------------------------------------------------------------------ watches and moves
    def watch(self, key: K, tokens: int) -> None:
        self._record(key).watch = tokens

    def reached(self, key: K, generated: int) -> bool:
        """Whether the sample's watch is met at `generated` tokens (no move asked): it is dropped then."""
        r = self._records.get(key)
        if r is None or r.watch is None or generated < r.watch or r.move is not None:
            return False
        r.watch = None
        return True

    def ask(self, key: K, move: Move) -> None:
        """A move asked of the sample's call."""
        self._record(key).move = move

    def answer(self, key: K) -> Move | None:
        """The move asked for the sample, answered now (None: none was asked)."""
        r = self._records.get(key)
        if r is None or r.move is None:
            return None
        move, r.move = r.move, None
        self._tidy(key)
        return move

    def moving(self, key: K | None = None) -> bool:
        """Whether a move is asked for the sample (for any sample, without one)."""
        if key is None:
            return any(r.move is not None for r in self._records.values())
        r = self._records.get(key)
        return r is not None and r.move is not None

    # ------------------------------------------------------------------ parked samples
    def park(self, key: K, parked: P, deferred: bool) -> None:
        """The sample in the fleet's hands: for a later round (`deferred`), or until it gets a place."""
        self._parked[key] = parked
        self._record(key).deferred = deferred

    def defer(self, key: K) -> None:
        self._record(key).deferred = True

    def parked(self, key: K) -> P | None:
        return self._parked.get(key)

    def unpark(self, key: K) -> P:
        parked = self._parked.pop(key)
        self._records[key].deferred = False
        self._tidy(key)
        return parked

    def parked_items(self) -> list[tuple[K, P]]:
        """Every parked sample, in the order parked."""
        return list(self._parked.items())

    # ------------------------------------------------------------------ faults
    def lose(self, key: K) -> int:
        """Its worker died under it: how often that has happened now."""
        r = self._record(key)
        r.losses += 1
        return r.losses

    # ------------------------------------------------------------------ asking
    def where(self, key: K) -> Where:
        """The sample's place and state."""
        r = self._records.get(key)
        if r is None:
            return Where("unknown", None, None, 0, None, 0)
        held = self._holdings.get(r.holder) if r.holder is not None else None
        tokens = 0 if held is None else held.tokens.get(key, held.samples[key].resumed)
        return Where(self._state(r, key, held), r.sid, r.holder, tokens, r.watch, r.losses)

    def _state(self, r: Record, key: K, held: _Holding[K, R] | None) -> State:
        if key in self._parked:
            return "parked" if r.deferred else "handed_back"
        if r.told or (held is not None and key in held.finished):
            return "finished"
        if r.move is not None:
            return "moving"
        if held is None:
            return "unknown"
        return "running" if held.tokens.get(key, held.samples[key].resumed) > 0 else "queued"

    def __len__(self) -> int:
        return len(self._records)

    def _record(self, key: K) -> Record:
        r = self._records.get(key)
        if r is None:
            r = self._records[key] = Record()
        return r

    def _holding(self, holder: int) -> _Holding[K, R]:
        return self._holdings.get(holder) or _Holding()

    def _tidy(self, key: K) -> None:
        r = self._records[key]
        if (r.sid is None and r.holder is None and r.move is None and r.watch is None and not r.losses
                and key not in self._parked):
            del self._records[key]
