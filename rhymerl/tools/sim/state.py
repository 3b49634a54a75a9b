"""The simulator's state of one sample and one worker (engine.py drives and moves them)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


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

    @property
    def stop(self) -> int:
        """Where its current run on a worker ends: the end of its turn, or `target`."""
        for end in self.turn_ends:
            if end > self.generated:
                return end
        return self.target


class SimWorker:
    __slots__ = (
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
        self.waiting: deque[SimSeq] = deque()
        self.c0 = 0.0
        self.step = step
        self.version = 0
        self.busy_since: float | None = None
        self.seg_step = step
