"""The simulator's workers as the executor's `Fleet` (rhymerl.algorithms.scheduling.executor):
what watching, moving and handing over a sample means in simulated time.

`dirty` and `progress` belong to the worker event being handled (engine.Simulator._on_worker): the
workers whose queues changed (refilled after the event) and the watched samples to report.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rhymerl.algorithms.scheduling.types import Move, SampleId

if TYPE_CHECKING:
    from .engine import Simulator
    from .state import SimSeq


class SimFleet:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.dirty: set[int] = set()
        self.progress: deque[tuple[int, int, int]] = deque()

    def watch(self, sid: SampleId, tokens: int) -> None:
        sim = self.sim
        q = sim.seqs[sid]
        if q.done or q.sid in sim.limbo:
            return
        q.watch = tokens
        if q.running:
            w = sim.workers[q.where]
            sim._advance(w, sim.now)
            wit = q.start_it + sim._passes(tokens - q.generated)
            if wit <= w.it:
                q.watch = None
                self.progress.append((q.sid, q.where, tokens))
            else:
                heapq.heappush(w.wat, (wit, q.sid, tokens))
                sim._schedule(w)

    def move(self, sid: SampleId, src: int | None, dst: int | None, generated: int | None, recompute: bool) -> Move:
        sim = self.sim
        q = sim.seqs[sid]
        # a sequence preempted back to its queue has no KV cache left to transfer
        recompute = recompute or (not q.running and q.generated > 0)
        origin = self._detach(q)
        if generated is not None and q.generated != generated:
            raise AssertionError(f"sample {sid}: scheduler moved it at {generated} tokens, simulator has {q.generated}")
        q.watch = None
        q.recompute = recompute
        sim.migrations.append((sim.now, sid, origin, -1 if dst is None else dst))
        sim.moves_of[q.step] = sim.moves_of.get(q.step, 0) + 1
        self.dirty.add(origin)
        if dst is None:
            sim.limbo.add(sid)
            sim._sample_left(q.step)
        else:
            target = sim.workers[dst]
            sim._advance(target, sim.now)
            target.waiting.appendleft(q)
            sim.idle.discard(dst)
            self.dirty.add(dst)
        return Move(sid=sid, src=origin, dst=dst, generated=q.generated, recompute=recompute)

    def _detach(self, q: SimSeq) -> int:
        """Remove a running or waiting sequence from its worker; returns the worker index."""
        sim = self.sim
        if q.running:
            w = sim.workers[q.where]
            sim._advance(w, sim.now)
            sim._remove(w, q)
            return w.idx
        for w in sim.workers:
            if q in w.waiting:
                w.waiting.remove(q)
                return w.idx
        raise AssertionError(f"sample {q.sid}: not on any worker")

    def waiting(self, worker: int) -> Sequence[SampleId]:
        w = self.sim.workers[worker]
        self.sim._advance(w, self.sim.now)
        return [q.sid for q in w.waiting]

    def running(self, worker: int) -> Sequence[SampleId]:
        w = self.sim.workers[worker]
        self.sim._advance(w, self.sim.now)
        return list(w.running)

    def generated(self, sid: SampleId) -> int:
        q = self.sim.seqs[sid]
        return self.sim._gen_at(q, self.sim.workers[q.where].it) if q.running else q.generated

    def unstarted(self, worker: int, step: int) -> Sequence[SampleId]:
        """A worker still on an earlier step has not taken up its planned samples of `step`."""
        v = self.sim.workers[worker]
        if v.step < step:
            return [q.sid for q in self.sim.pending[step][worker]]
        if v.step == step:
            return [q.sid for q in v.waiting if q.step == step and q.generated == 0]
        return []

    def hand_over(self, move: Move) -> None:
        sim = self.sim
        q = sim.seqs[move.sid]
        src = sim.workers[move.src]
        if src.step < q.step:
            sim.pending[q.step][move.src].remove(q)
        else:
            src.waiting.remove(q)
        assert move.dst is not None
        sim.workers[move.dst].waiting.append(q)
