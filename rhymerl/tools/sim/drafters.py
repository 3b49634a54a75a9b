"""Drafters on freed workers, carried out in the simulator: after every event the decision
(scheduling/freed_drafters.py) on the fleet as it stands, consolidation of a straggler onto another
worker, and a drafted worker's samples going on at the drafted tokens per pass.

The simulator's part for it (engine.Simulator holds one when `SimConfig.freed_drafters` is set): it
acts on the run's books through `SimHost` and keeps the pairs in force and what they did.
"""

from __future__ import annotations

import heapq

from rhymerl.algorithms.scheduling.costmodel import IterationProfile, SpeculationSpeedup
from rhymerl.algorithms.scheduling.freed_drafters import DraftCosts, WorkerView, decide
from rhymerl.algorithms.scheduling.types import Move

from .drafting import DraftSpan
from .host import SimHost
from .state import SimWorker


class FreedDrafters:
    """Pairs freed workers with straggling ones after each event, and empties a straggler to draft."""

    def __init__(self, host: SimHost, costs: DraftCosts, profile: IterationProfile,
                 speculation: SpeculationSpeedup) -> None:
        self.host = host
        self.costs = costs
        self.profile = profile
        self.speculation = speculation
        self.drafting: dict[int, int] = {}
        """Drafter -> verifier in force (freed_drafters.assign)."""
        self.spans: list[DraftSpan] = []
        """Every drafter's assignment as it ran: drafter, verifier, start, end."""
        self.since: dict[int, float] = {}
        """Drafter in force -> when its assignment began."""
        self.consolidations = 0
        """Workers emptied onto another so that they draft (DraftCosts.consolidate)."""

    def place(self) -> None:
        """After an event: the decision (freed_drafters.decide, the one the rollout fleet makes) on the
        fleet as it stands; a verifier whose drafter changed goes on at its new tokens per pass. With
        `consolidate`, a straggling worker left without a drafter is first emptied onto another where
        the decision says so, its samples moved with their tokens. A worker's remaining work
        is predicted from what has run: as many tokens again as its longest-running sample has made,
        at least one (the work-stealing rule's fallback; the simulator does not peek at true lengths)."""
        h, costs = self.host, self.costs
        current = self.drafting
        for _ in range(len(h.workers)):  # each consolidation empties a worker: a bounded loop
            freed = [w.idx for w in h.workers if not w.running and not w.waiting and w.idx not in h.gone]
            if not freed and not self.drafting and not costs.consolidate:
                return
            views = self._views() if freed or costs.consolidate else []
            plan = decide(views, freed, current, self.profile, costs, self.speculation)
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
                self.spans.append(DraftSpan(d, v, self.since.pop(d), h.now))
        for d, v in new.items():
            if self.drafting.get(d) != v:
                self.since[d] = h.now
        self.drafting = new
        for v in sorted(set(old_of) | set(new_of)):
            if old_of.get(v) != new_of.get(v):
                self._redraft(h.workers[v], new_of.get(v))

    def close(self) -> None:
        """The run ended: the assignments in force end now."""
        for d, v in self.drafting.items():
            self.spans.append(DraftSpan(d, v, self.since.pop(d), self.host.now))
        self.drafting = {}

    def _views(self) -> list[WorkerView]:
        """The workers a drafter could serve, as the decision sees them."""
        h = self.host
        views = []
        for w in h.workers:
            b = len(w.running)
            if not 1 <= b <= self.costs.max_batch or w.waiting or w.idx in h.gone:
                continue
            it = h.decode.reached_it(w, h.now)
            views.append(WorkerView(worker=w.idx, running=b, queued=0, context=(w.c0 + b * w.alpha * it) / b,
                                    remaining=float(max(1, *(h.decode.gen_at(q, it, w.alpha) for q in w.running.values())))))
        return views

    def _consolidate(self, src: int, dst: int) -> None:
        """Move every running sample of `src` to `dst` with its tokens (`dst` recomputes their KV
        cache), through the executor, booked as rebalances."""
        h = self.host
        w = h.workers[src]
        h.decode.advance(w, h.now)
        moves = [Move(sid=q.sid, src=src, dst=dst, generated=h.decode.gen_at(q, w.it, w.alpha), recompute=True)
                 for q in sorted(w.running.values(), key=lambda q: q.admitted)]
        outer, h.dirty = h.dirty, set()
        h.executor.consolidate(moves)
        touched, h.dirty = h.dirty, outer
        self.consolidations += 1
        for idx in sorted(touched):
            h.refill(h.workers[idx])

    def _redraft(self, w: SimWorker, drafter: int | None) -> None:
        """The worker's drafts now come from `drafter` (None: its own speculation again). Its running
        sequences keep the whole tokens they have made and go on at the new tokens per pass; the
        pass under way is spent (as for a move)."""
        h = self.host
        h.decode.advance(w, h.now)
        alpha = h.alpha if drafter is None else max(h.alpha, self.costs.tokens_per_pass)
        for q in w.running.values():
            q.generated = h.decode.gen_at(q, w.it, w.alpha)
            q.start_it = w.it
        w.alpha = alpha
        w.drafter = drafter
        w.c0 = float(sum(q.input_len + q.generated - q.start_it * alpha for q in w.running.values()))
        for q in w.running.values():
            heapq.heappush(w.fin, (q.start_it + h.decode.passes(q.stop - q.generated, alpha), q.sid))
            if q.watch is not None:
                heapq.heappush(w.wat, (q.start_it + h.decode.passes(q.watch - q.generated, alpha), q.sid, q.watch))
        h.events.schedule(w)
