"""Workers joining and leaving a simulated fleet while it runs (elastic.py decides when).

Mid-step a worker that leaves keeps its index, taking no work, and its samples go to the live
workers through the executor's evacuation; with nobody live they wait on it until a worker joins.
A worker that joins gets a new index. Between steps, with the fleet quiescent, the workers that stay
are renumbered 0..n-1, as the rollout fleet renumbers its members each round.
"""

from __future__ import annotations

from .config import SimulationError
from .host import SimHost
from .state import SimWorker


class Membership:
    """Joins, leaves, hand-backs and renumbering of the simulated workers."""

    def __init__(self, host: SimHost) -> None:
        self.host = host

    def live_slots(self) -> list[int]:
        """The indexes of the workers that have not left."""
        h = self.host
        return [i for i in range(len(h.workers)) if i not in h.gone]

    def quiescent(self) -> bool:
        """No worker holds a sample, none is out at a tool call and no plan waits to be taken up: the
        fleet may be renumbered."""
        h = self.host
        return (not h.at_tool and all(not w.running and not w.waiting for w in h.workers)
                and all(not q for queues in h.pending.values() for q in queues))

    def leave(self, slot: int, keep_tokens: bool) -> int:
        """Worker `slot` leaves now. Its running samples stop (keeping their tokens when `keep_tokens`,
        the hand-back of a usable notice; else losing them) and go, with its queued ones, to the live
        workers through the executor's evacuation. Returns the generated tokens lost."""
        h = self.host
        w = h.workers[slot]
        h.admission.hand_over(w, h.now)
        lost = 0
        if not keep_tokens:
            for q in w.waiting:
                lost += q.generated
                q.generated = 0
        w.version += 1
        h.admission.close(w, h.now)
        h.gone.add(slot)
        h.idle.discard(slot)
        self.hand_back()
        return lost

    def hand_back(self) -> None:
        """Spread the samples that workers who left still hold over the live workers (none live: they
        wait for one to join), then let the workers that received some admit them."""
        h = self.host
        live = self.live_slots()
        if not live:
            return
        outer, h.dirty = h.dirty, set()
        for slot in sorted(h.gone):
            held = h.workers[slot].waiting
            for step in sorted({q.step for q in held}):
                h.executor.evacuate(slot, step, [(q.sid, q.generated) for q in held if q.step == step], live)
        touched, h.dirty = h.dirty, outer
        for idx in sorted(touched - h.gone):
            h.refill(h.workers[idx])

    def compact(self, keep: list[int]) -> None:
        """Between steps (the fleet quiescent): the workers `keep` become 0..n-1, the others are gone."""
        h = self.host
        if not keep:
            raise SimulationError("compact: a fleet needs at least one worker")
        workers = [h.workers[i] for i in keep]
        fresh = max((w.version for w in h.workers), default=0) + 1  # events of the old numbering go stale
        for idx, w in enumerate(workers):
            w.idx = idx
            w.waiting.owner = idx
            w.version = fresh
        h.workers = workers
        h.gone = set()
        h.idle = set(range(len(workers)))
        h.sched.set_workers(len(workers))
        self._resize_cap()

    def join(self) -> int:
        """A worker joins now; its index. Between steps with nobody live it starts a new numbering."""
        h = self.host
        if not self.live_slots() and self.quiescent():
            h.workers, h.gone = [], set()
            idx = 0
            h.sched.set_workers(1)
        else:
            idx = h.sched.add_worker()
        if idx != len(h.workers):
            raise SimulationError(f"join: the scheduler numbered the new worker {idx}, the simulator has {len(h.workers)}")
        w = SimWorker(idx, h.last_plan, h.alpha)
        w.clock = h.now
        w.version = max((v.version for v in h.workers), default=0) + 1
        h.workers.append(w)
        self._resize_cap()
        h.idle.add(idx)
        self.hand_back()
        h.open_gates()
        return idx

    def _resize_cap(self) -> None:
        """The workers' concurrency for the live fleet (Simulator.concurrency)."""
        h = self.host
        h.admission.cap = h.concurrency(len(self.live_slots()))
