"""The executor's `Fleet` (scheduling/executor.py) in simulated time: the simulator answers every
move at once, watches a sample's token count through its worker's heaps, and tells what a worker
has not finished of a step without making that an event of the worker."""

from __future__ import annotations

import heapq

from rhymerl.algorithms.scheduling.types import Move, SampleId

from .host import SimHost
from .state import SimSeq


class ExecutorPort:
    """Carries out the executor's watches and moves on the simulated workers."""

    def __init__(self, host: SimHost) -> None:
        self.host = host

    def watch(self, sid: SampleId, tokens: int) -> None:
        h = self.host
        q = h.seqs[sid]
        if q.done or q.sid in h.limbo:
            return
        q.watch = tokens
        if q.running:
            w = h.workers[q.where]
            h.decode.advance(w, h.now)
            wit = q.start_it + h.decode.passes(tokens - q.generated, w.alpha)
            if wit <= w.it:
                q.watch = None
                h.progress.append((q.sid, q.where, tokens))
            else:
                heapq.heappush(w.wat, (wit, q.sid, tokens))
                h.events.schedule(w)

    def request(self, move: Move) -> None:
        """Carried out at once: a sample with tokens goes to the front of its destination's queue
        (it resumes), an unstarted one to the back; inter-step, it leaves for the next plan."""
        h = self.host
        q = h.seqs[move.sid]
        # a sequence preempted back to its queue has no KV cache left to transfer
        recompute = move.recompute or (not q.running and q.generated > 0)
        origin = self.detach(q)
        if q.generated != move.generated:
            raise AssertionError(f"sample {move.sid}: moved at {move.generated} tokens, the simulator has {q.generated}")
        q.watch = None
        q.recompute = recompute
        if h.executor.in_flight[move.sid].reason in ("migrate", "rebalance"):  # steals are counted apart
            h.migrations.append((h.now, move.sid, origin, -1 if move.dst is None else move.dst))
            h.moves_of[q.step] = h.moves_of.get(q.step, 0) + 1
        h.dirty.add(origin)
        if move.dst is None:
            h.limbo.add(move.sid)
            h.sample_left(q.step)
        else:
            target = h.workers[move.dst]
            h.decode.advance(target, h.now)
            if q.generated > 0:
                target.waiting.appendleft(q)
            else:
                target.waiting.append(q)
            h.idle.discard(move.dst)
            h.dirty.add(move.dst)
        h.executor.confirmed(Move(sid=move.sid, src=origin, dst=move.dst, generated=q.generated,
                                  recompute=recompute))

    def detach(self, q: SimSeq) -> int:
        """Remove a running, waiting or not yet taken-up sequence from its worker; the worker index."""
        h = self.host
        if q.running:
            w = h.workers[q.where]
            h.decode.advance(w, h.now)
            h.admission.remove(w, q)
            return w.idx
        queue = q.queue  # a worker's waiting samples or its planned share of a step not taken up yet
        if queue is None or queue is h.shared:
            raise AssertionError(f"sample {q.sid}: not on any worker")
        queue.remove(q)
        return queue.owner

    def unfinished(self, worker: int, step: int) -> list[tuple[SampleId, int]]:
        """A worker still on an earlier step has not taken up its planned samples of `step` yet."""
        h = self.host
        v = h.workers[worker]
        if v.step < step:
            return [(q.sid, q.generated) for q in h.pending[step][worker]]
        if v.step > step:
            return []
        it = h.decode.reached_it(v, h.now)  # read only: asking is not an event of the worker
        return [*((q.sid, q.generated) for q in v.waiting if q.step == step),
                *((q.sid, h.decode.gen_at(q, it, v.alpha)) for q in v.running.values() if q.step == step)]
