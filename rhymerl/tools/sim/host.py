"""What the simulator's parts see of the run they serve (engine.Simulator is the one implementation).

The executor's port (port.py), tool calls (tool_calls.py), fleet membership (membership.py) and the
freed drafters (drafters.py) each act on the run's shared books and call back into its round driver;
they name that run by this Protocol rather than by `Simulator`, so none of them imports the engine
that composes them.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.executor import Executor

from .admission import Admission
from .events import EventQueue
from .state import SeqQueue, SimSeq, SimWorker
from .timing import DecodeModel


class SimHost(Protocol):
    """The run's books and the round driver's entry points."""

    sched: Scheduler
    executor: Executor
    decode: DecodeModel
    admission: Admission
    events: EventQueue
    alpha: float
    now: float
    workers: list[SimWorker]
    seqs: dict[int, SimSeq]
    shared: SeqQueue
    """The shared pipeline's queue."""
    pending: dict[int, list[SeqQueue]]
    """Per step, per worker: planned samples the worker has not taken up yet."""
    last_plan: int
    idle: set[int]
    gone: set[int]
    """Workers that left the fleet: they take no work; their index stays until compacted."""
    dirty: set[int]
    """Workers whose queues changed while handling the current event (refilled after it)."""
    progress: deque[tuple[int, int, int]]
    """Watched samples that reached their count during the current event: (sample, worker, tokens)."""
    limbo: set[int]
    """Samples moved to the next step's plan, on no worker."""
    at_tool: dict[int, int]
    """Multi-turn samples out at a tool call: the worker whose queue they return to."""
    migrations: list[tuple[float, int, int, int]]
    moves_of: dict[int, int]

    def refill(self, w: SimWorker, most: int | None = None) -> None:
        """Admit the worker's waiting work; a worker whose share is done moves on."""

    def sample_left(self, step: int) -> None:
        """A sample of `step` finished or left it for the next step's plan."""

    def open_gates(self) -> None:
        """Plan what may start, deal the shared queue, let idle workers start or steal."""

    def concurrency(self, workers: int) -> int:
        """How many samples a worker runs at once on `workers` workers."""
