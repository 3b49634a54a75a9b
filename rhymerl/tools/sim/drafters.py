"""Drafters on freed workers, carried out in the simulator: after every event the decision
(scheduling/freed_drafters.py) on the fleet as it stands, consolidation of a straggler onto another
worker, and a drafted worker's samples going on at the drafted tokens per pass.

A mixin of `engine.Simulator`: its methods act on the simulator's books, named by `DraftHost`.
"""

from __future__ import annotations

import heapq
from typing import Protocol

from rhymerl.algorithms.scheduling.costmodel import IterationProfile
from rhymerl.algorithms.scheduling.executor import Executor
from rhymerl.algorithms.scheduling.freed_drafters import DraftCosts, WorkerView, decide
from rhymerl.algorithms.scheduling.types import Move

from .config import SimConfig, SimulationError
from .drafting import DraftSpan
from .state import SimSeq, SimWorker


class DraftHost(Protocol):
    """What the drafter placement reads and changes of the simulator."""

    draft_costs: DraftCosts | None
    drafting: dict[int, int]
    """Drafter -> verifier in force (freed_drafters.assign)."""
    draft_spans: list[DraftSpan]
    _draft_since: dict[int, float]
    consolidations: int
    workers: list[SimWorker]
    gone: set[int]
    profile: IterationProfile
    cfg: SimConfig
    now: float
    dirty: set[int]
    executor: Executor
    alpha: float

    @property
    def hooks(self) -> object | None: ...

    def _reached_it(self, w: SimWorker, now: float, /) -> int: ...

    def _gen_at(self, q: SimSeq, it: int, alpha: float, /) -> int: ...

    def _advance(self, w: SimWorker, now: float, /) -> None: ...

    def _passes(self, tokens: int, alpha: float, /) -> int: ...

    def _schedule(self, w: SimWorker, /) -> None: ...

    def _refill(self, w: SimWorker, /) -> None: ...

    def _draft_views(self, costs: DraftCosts) -> list[WorkerView]: ...

    def _consolidate(self, src: int, dst: int) -> None: ...

    def _redraft(self, w: SimWorker, drafter: int | None) -> None: ...


class FreedDrafters:
    """The four steps of drafter placement, as methods of the simulator."""

    def _place_drafters(self: DraftHost) -> None:
        """After an event: the decision (freed_drafters.decide, the one the rollout fleet makes) on the
        fleet as it stands; a verifier whose drafter changed goes on at its new tokens per pass. With
        `consolidate`, a straggling worker left without a drafter is first emptied onto another where
        the decision says so, its samples moved with their tokens. A worker's remaining work
        is predicted from what has run: as many tokens again as its longest-running sample has made,
        at least one (the work-stealing rule's fallback; the simulator does not peek at true lengths)."""
        if self.hooks is not None:
            raise SimulationError("freed drafters: not priced on a fleet that changes while it runs")
        costs = self.draft_costs
        assert costs is not None
        current = self.drafting
        for _ in range(len(self.workers)):  # each consolidation empties a worker: a bounded loop
            freed = [w.idx for w in self.workers if not w.running and not w.waiting and w.idx not in self.gone]
            if not freed and not self.drafting and not costs.consolidate:
                return
            views = self._draft_views(costs) if freed or costs.consolidate else []
            plan = decide(views, freed, current, self.profile, costs, self.cfg.speculation)
            new, merge = plan.pairs, plan.merge
            if merge is None:
                break
            self._consolidate(*merge)
            current = {**new, merge[0]: merge[1]}  # the emptied worker drafts for the one it filled
        if new == self.drafting:
            return
        old_of = {v: d for d, v in self.drafting.items()}
        new_of = {v: d for d, v in new.items()}
        for d, v in self.drafting.items():
            if new.get(d) != v:
                self.draft_spans.append(DraftSpan(d, v, self._draft_since.pop(d), self.now))
        for d, v in new.items():
            if self.drafting.get(d) != v:
                self._draft_since[d] = self.now
        self.drafting = new
        for v in sorted(set(old_of) | set(new_of)):
            if old_of.get(v) != new_of.get(v):
                self._redraft(self.workers[v], new_of.get(v))

    def _draft_views(self: DraftHost, costs: DraftCosts) -> list[WorkerView]:
        """The workers a drafter could serve, as the decision sees them."""
        views = []
        for w in self.workers:
            b = len(w.running)
            if not 1 <= b <= costs.max_batch or w.waiting or w.idx in self.gone:
                continue
            it = self._reached_it(w, self.now)
            views.append(WorkerView(worker=w.idx, running=b, queued=0, context=(w.c0 + b * w.alpha * it) / b,
                                    remaining=float(max(1, *(self._gen_at(q, it, w.alpha) for q in w.running.values())))))
        return views

    def _consolidate(self: DraftHost, src: int, dst: int) -> None:
        """Move every running sample of `src` to `dst` with its tokens (`dst` recomputes their KV
        cache), through the executor, booked as rebalances."""
        w = self.workers[src]
        self._advance(w, self.now)
        moves = [Move(sid=q.sid, src=src, dst=dst, generated=self._gen_at(q, w.it, w.alpha), recompute=True)
                 for q in sorted(w.running.values(), key=lambda q: q.admitted)]
        outer, self.dirty = self.dirty, set()
        self.executor.consolidate(moves)
        touched, self.dirty = self.dirty, outer
        self.consolidations += 1
        for idx in sorted(touched):
            self._refill(self.workers[idx])

    def _redraft(self: DraftHost, w: SimWorker, drafter: int | None) -> None:
        """The worker's drafts now come from `drafter` (None: its own speculation again). Its running
        sequences keep the whole tokens they have made and go on at the new tokens per pass; the
        pass under way is spent (as for a move)."""
        assert self.draft_costs is not None
        self._advance(w, self.now)
        alpha = self.alpha if drafter is None else max(self.alpha, self.draft_costs.tokens_per_pass)
        for q in w.running.values():
            q.generated = self._gen_at(q, w.it, w.alpha)
            q.start_it = w.it
        w.alpha = alpha
        w.drafter = drafter
        w.c0 = float(sum(q.input_len + q.generated - q.start_it * alpha for q in w.running.values()))
        for q in w.running.values():
            heapq.heappush(w.fin, (q.start_it + self._passes(q.stop - q.generated, alpha), q.sid))
            if q.watch is not None:
                heapq.heappush(w.wat, (q.start_it + self._passes(q.watch - q.generated, alpha), q.sid, q.watch))
        self._schedule(w)
