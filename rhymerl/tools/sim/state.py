"""The simulator's state of one sample and one worker (engine.py drives and moves them), its
queues of samples, and the trace's steps read into them.

A queue (`SeqQueue`: a worker's waiting samples, a step's planned share of a worker, the shared
pipeline's queue) is a deque whose samples can also be taken out from anywhere in O(1): a move
(port.ExecutorPort.request) takes a waiting sample out of its queue, and a step of hundreds of
thousands of samples queues thousands on each worker, so finding it by a scan and removing it from
a deque (O(queue) each) made a large step's moves quadratic. Each sample knows its queue
(`SimSeq.queue`); a removal leaves a stale entry behind that the front and the iteration skip, and
stale entries are compacted away once they outnumber the live ones: every operation is O(1)
amortised, and iteration is in the order a deque would give.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.types import Sample
from rhymerl.tools.traces.model import PromptIds, Trace


@dataclass(slots=True)
class SimSeq:
    sid: int
    input_len: int
    target: int
    step: int
    origin: int = 0
    """The trace step it belongs to (`step` follows inter-step migrations)."""
    generated: int = 0
    start_it: int = 0
    watch: int | None = None
    recompute: bool = True
    where: int = -1  # worker index, -1 nowhere (planned-not-placed, shared queue or deferred)
    admitted: int = -1
    """Order of its latest admission on any worker (preemption takes the last admitted first)."""
    running: bool = False
    done: bool = False
    turn_ends: tuple[int, ...] = ()
    """Multi-turn: the token counts at which a turn ends and a tool call starts (the last turn's end,
    `target`, not listed); empty for a single-turn sample."""
    tool_s: tuple[float, ...] = ()
    """Seconds of the tool call at each of `turn_ends`."""
    queue: SeqQueue | None = field(default=None, repr=False, compare=False)
    """The queue it waits in (a SeqQueue keeps it), None while it runs, is out or is done."""

    @property
    def stop(self) -> int:
        """Where its current run on a worker ends: the end of its turn, or `target`."""
        for end in self.turn_ends:
            if end > self.generated:
                return end
        return self.target


class SimWorker:
    __slots__ = (
        "_admissions",
        "alpha",
        "busy_since",
        "c0",
        "clock",
        "drafter",
        "fin",
        "idx",
        "it",
        "running",
        "seg_step",
        "step",
        "version",
        "waiting",
        "wat",
    )

    def __init__(self, idx: int, step: int, alpha: float = 1.0) -> None:
        self.idx = idx
        self.alpha = alpha
        """Tokens per pass of its running sequences (the run's speculation, more while drafted for)."""
        self.drafter: int | None = None
        """The freed worker drafting for its running samples (freed_drafters.py); None: none."""
        self.clock = 0.0
        self.it = 0
        self.running: dict[int, SimSeq] = {}
        self.fin: list[tuple[int, int]] = []
        self.wat: list[tuple[int, int, int]] = []
        self.waiting = SeqQueue(idx)
        self._admissions: list[tuple[int, int]] = []
        """Max-heap of (-admission order, sample) of running sequences; stale once the sample left or
        was admitted again."""
        self.c0 = 0.0
        self.step = step
        self.version = 0
        self.busy_since: float | None = None
        self.seg_step = step

    def admitted(self, q: SimSeq) -> None:
        """`q` (now in `running`) was admitted in order `q.admitted`."""
        heap = self._admissions
        if len(heap) > 2 * len(self.running) + 64:  # drop stale entries: the heap stays O(batch)
            heap[:] = [(-r.admitted, r.sid) for r in self.running.values() if r is not q]
            heapq.heapify(heap)
        heapq.heappush(heap, (-q.admitted, q.sid))

    def last_admitted(self) -> SimSeq:
        """The running sequence admitted last (admission orders are unique): what preemption takes,
        in O(log batch) amortised rather than a scan of the batch."""
        heap = self._admissions
        while True:
            order, sid = heap[0]
            q = self.running.get(sid)
            if q is not None and q.admitted == -order:
                return q
            heapq.heappop(heap)


class SeqQueue:
    """Sequences in order; each in at most one queue at a time (`SimSeq.queue`)."""

    __slots__ = ("_entries", "_live", "_serial", "owner")

    def __init__(self, owner: int, seqs: Iterable[SimSeq] = ()) -> None:
        self.owner = owner
        """The worker index the queue belongs to (-1: the shared queue)."""
        self._entries: deque[tuple[int, SimSeq]] = deque()
        self._live: dict[int, int] = {}
        """Sample -> serial of its live entry (older entries of the sample are stale)."""
        self._serial = 0
        self.extend(seqs)

    def _enter(self, q: SimSeq) -> tuple[int, SimSeq]:
        if q.queue is not None:
            raise AssertionError(f"sample {q.sid}: queued twice")
        self._serial += 1
        self._live[q.sid] = self._serial
        q.queue = self
        return self._serial, q

    def _prune(self) -> None:
        """Drop stale entries at the front; compact when stale ones outnumber live ones."""
        entries, live = self._entries, self._live
        while entries and live.get(entries[0][1].sid) != entries[0][0]:
            entries.popleft()
        if len(entries) > 2 * len(live) + 32:
            self._entries = deque(e for e in entries if live.get(e[1].sid) == e[0])

    def append(self, q: SimSeq) -> None:
        self._entries.append(self._enter(q))

    def appendleft(self, q: SimSeq) -> None:
        self._entries.appendleft(self._enter(q))

    def extend(self, seqs: Iterable[SimSeq]) -> None:
        for q in seqs:
            self.append(q)

    def first(self) -> SimSeq:
        """The sequence at the front (IndexError when empty)."""
        if not self._live:
            raise IndexError("first: empty queue")
        return self._entries[0][1]

    def popleft(self) -> SimSeq:
        q = self.first()
        self._entries.popleft()
        del self._live[q.sid]
        q.queue = None
        self._prune()
        return q

    def remove(self, q: SimSeq) -> None:
        """Take `q` out from wherever it stands (ValueError when it is not here)."""
        if q.queue is not self:
            raise ValueError(f"sample {q.sid}: not in this queue")
        del self._live[q.sid]
        q.queue = None
        self._prune()

    def drain(self) -> list[SimSeq]:
        """Every sequence, in order, leaving the queue empty."""
        out = list(self)
        for q in out:
            q.queue = None
        self._entries.clear()
        self._live.clear()
        return out

    def __contains__(self, q: object) -> bool:
        return isinstance(q, SimSeq) and q.queue is self

    def __iter__(self) -> Iterator[SimSeq]:
        live = self._live
        return (q for serial, q in list(self._entries) if live.get(q.sid) == serial)

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)


def trace_seqs(trace: Trace, rows: list[NDArray[np.int64]], first: int, last: int
               ) -> tuple[dict[int, list[Sample]], dict[int, SimSeq]]:
    """Steps `first`..`last` of the trace (`rows`: each step's rows): each step's samples for the
    scheduler, and the simulator's sequence of every row (ids are trace rows). Columns are read as
    Python lists once, not a NumPy scalar per cell: a trace of millions of rows is built in seconds."""
    inputs, outputs = trace.input_len.tolist(), trace.output_len.tolist()
    step_samples: dict[int, list[Sample]] = {}
    seqs: dict[int, SimSeq] = {}
    for s in range(first, last + 1):
        idx = rows[s - 1]
        batch = []
        for i, pid in zip(idx.tolist(), PromptIds(trace.prompt_id.codes[idx], trace.prompt_id.names), strict=True):
            inp, out = inputs[i], outputs[i]
            batch.append(Sample(sid=i, prompt_id=pid, input_len=inp, oracle_len=out))
            seqs[i] = q = SimSeq(sid=i, input_len=inp, target=out, step=s, origin=s)
            if trace.turns is not None:
                tokens, tool_s = trace.turns.of_row(i)
                q.turn_ends = tuple(np.cumsum(tokens[:-1]).tolist())
                q.tool_s = tuple(tool_s[:-1])
        step_samples[s] = batch
    return step_samples, seqs


def prime_history(scheduler: Scheduler, trace: Trace, rows: list[NDArray[np.int64]]) -> None:
    """Warm-up steps are not simulated: their lengths become the scheduler's history, as last
    epoch's would (`rows`: each warm-up step's rows)."""
    for step_rows in rows:
        per: dict[str, list[int]] = {}
        for i in step_rows.tolist():
            per.setdefault(trace.prompt_id[i], []).append(int(trace.output_len[i]))
        for pid, lens in per.items():
            scheduler.prime(pid, lens)
