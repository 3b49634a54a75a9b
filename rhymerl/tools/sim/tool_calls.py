"""Multi-turn samples between turns: a sample whose turn ended leaves its worker's batch for its tool
call, holding no GPU and dropping its KV cache, and comes back to the queue its placement says with
its tokens, so its next turn starts with a prefill of prompt + tokens so far."""

from __future__ import annotations

from .events import TOOL
from .host import SimHost
from .state import SimSeq


class ToolCalls:
    """Sends samples out to their tool calls and takes them back when the tool answers."""

    def __init__(self, host: SimHost) -> None:
        self.host = host

    def leave(self, q: SimSeq, worker: int) -> None:
        """A turn of `q` ended on `worker` (already off it): its tool call answers after its seconds."""
        h = self.host
        q.recompute = True
        h.at_tool[q.sid] = worker
        h.events.push(h.now + q.tool_s[q.turn_ends.index(q.generated)], TOOL, q.sid)

    def answered(self, sid: int) -> None:
        """The tool answered: the sample re-enters the queue its placement says, at the front (it
        resumes): the shared queue, or its worker's own (a worker that left hands it on)."""
        h = self.host
        q = h.seqs[sid]
        worker = h.at_tool.pop(sid)
        if h.sched.pipeline == "shared":
            h.shared.appendleft(q)
            room = [w for w in h.workers if len(w.running) < h.admission.cap and w.idx not in h.gone]
            if room:
                w = min(room, key=lambda v: (len(v.running), v.idx))
                h.idle.discard(w.idx)
                h.refill(w, 1)
            return
        w = h.workers[worker]
        w.waiting.appendleft(q)
        live = [i for i in range(len(h.workers)) if i not in h.gone]
        if worker not in h.gone:
            h.idle.discard(worker)
            h.refill(w)
        elif live:  # as Membership.hand_back does; with nobody live it waits there for a worker to join
            outer, h.dirty = h.dirty, set()
            h.executor.evacuate(worker, q.step, [(q.sid, q.generated)], live)
            touched, h.dirty = h.dirty, outer
            for idx in sorted(touched - h.gone):
                h.refill(h.workers[idx])
