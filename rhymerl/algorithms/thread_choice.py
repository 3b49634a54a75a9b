"""How many intra-op threads a CPU engine's passes should use, from the pass times it observes.

torch's CPU kernels split every parallel region over their threads and wait at a barrier for the
last. On a machine other processes keep busy, one of those threads is often descheduled, and
every region of a pass waits for it: the quickstart's first epoch took 13 s idle at 2 threads,
49 s beside one busy process and 293 s beside two, against 19 / 21 / 30 s at 1 thread. The fair
share of a contended machine is reached with fewer threads, and only timing tells which.

`ThreadChooser` holds no clock and calls no torch: the engine reports each pass (threads it ran
at, seconds, tokens it computed) and asks what the next pass should run at. It starts at 1 thread,
as the mistakes are lopsided: a pass at 1 thread on an idle 2-core machine costs 1.6x one at 2,
while 2 threads beside a busy process cost 10-50x (and a contended start has a prefill too). From
there it probes the next count up or down its ladder (the configured count, halved down to 1)
for a few passes, and moves when the probe's median per-token time beats the median of the passes
just before it by `margin` (hysteresis: noise does not make it flap). After a move it soon probes
on in the same direction, so it climbs to the configured count of an idle machine within a few
dozen passes. A probe pass more than `abort` times slower than the current count (twice that for
its first, which also starts the threads) ends the probe at once. Probes that keep confirming the current count come twice as rarely each time, up to
`max_every` passes or `max_every_s` seconds; a move starts over.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field


def ladder(configured: int) -> tuple[int, ...]:
    """The counts a chooser may run at: `configured`, then halved down to 1 (e.g. 16, 8, 4, 2, 1)."""
    counts = [max(1, configured)]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    return tuple(counts)


@dataclass
class ThreadChooser:
    """The thread count for each pass; `threads()` before it, `observe()` after it (module docstring)."""

    configured: int
    window: int = 8
    """Passes at the current count a probe is compared with (the latest ones)."""
    first: int = 2
    """Passes before the first probe, and before the next one after a move that has further to go."""
    probe_passes: int = 4
    """Passes timed at the probed count (after one that is dropped: it pays for starting the threads)."""
    every: int = 128
    every_s: float = 2.0
    """A probe after this many passes or seconds at the current count, whichever comes first."""
    max_every: int = 4096
    max_every_s: float = 32.0
    margin: float = 0.15
    """The probed count must be this much faster per token to be taken."""
    abort: float = 3.0
    current: int = field(init=False)
    probes: int = field(init=False, default=0)
    switches: int = field(init=False, default=0)
    passes_at: dict[int, int] = field(init=False, default_factory=dict)
    """Passes observed per thread count (the dropped ones too): what the chooser cost and chose."""
    _counts: tuple[int, ...] = field(init=False)
    _recent: deque[float] = field(init=False)
    _probe: list[float] = field(init=False, default_factory=list)
    _target: int | None = field(init=False, default=None)
    _drop: int = field(init=False, default=0)  # passes still to drop after a change of count
    _since: int = field(init=False, default=0)  # passes at the current count since the last probe
    _since_s: float = field(init=False, default=0.0)
    _interval: int = field(init=False)
    _interval_s: float = field(init=False)
    _down_next: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        if min(self.configured, self.window, self.first, self.probe_passes) < 1:
            raise ValueError("configured, window, first and probe_passes must be at least 1")
        self._counts = ladder(self.configured)
        self.current = self._counts[-1]
        self._recent = deque(maxlen=self.window)
        self._interval, self._interval_s = self.first, self.every_s

    def threads(self) -> int:
        """The count the next pass should run at."""
        return self._target if self._target is not None else self.current

    def observe(self, threads: int, seconds: float, work: float) -> None:
        """A pass ran at `threads` for `seconds`, computing `work` tokens. A pass at another count
        than `threads()` said (the process's count was changed under it) teaches nothing."""
        self.passes_at[threads] = self.passes_at.get(threads, 0) + 1
        if threads != self.threads():
            return
        cost = seconds / max(work, 1.0)
        if self._target is None:
            self._run(cost, seconds)
        else:
            self._probing(cost)

    def _run(self, cost: float, seconds: float) -> None:
        if self._drop:
            self._drop -= 1
            return
        self._recent.append(cost)
        self._since += 1
        self._since_s += seconds
        due = self._since >= self._interval or self._since_s >= self._interval_s
        if len(self._counts) > 1 and len(self._recent) >= min(self.first, self.window) and due:
            self._target = self._neighbour()
            self._probe, self._drop = [], 1
            self.probes += 1

    def _neighbour(self) -> int:
        """The next count down the ladder or up it, alternating where both exist."""
        i = self._counts.index(self.current)
        down = self._counts[i + 1] if i + 1 < len(self._counts) else None
        up = self._counts[i - 1] if i > 0 else None
        pick = down if (self._down_next and down is not None) or up is None else up
        self._down_next = not self._down_next
        assert pick is not None
        return pick

    def _probing(self, cost: float) -> None:
        base = statistics.median(self._recent)
        if cost > self.abort * base * (2 if self._drop else 1):  # the dropped pass also starts the threads
            self._end(switch=False)
            return
        if self._drop:
            self._drop -= 1
            return
        self._probe.append(cost)
        if len(self._probe) >= self.probe_passes:
            self._end(switch=statistics.median(self._probe) < (1.0 - self.margin) * base)

    def _end(self, switch: bool) -> None:
        target, self._target = self._target, None
        self._since, self._since_s = 0, 0.0
        if switch and target is not None:
            down = target < self.current
            self.current = target
            self.switches += 1
            self._recent.clear()
            self._recent.extend(self._probe)
            i = self._counts.index(target)
            further = 0 <= i + (1 if down else -1) < len(self._counts)
            self._down_next = down if further else not down
            self._interval, self._interval_s = (self.first if further else self.every), self.every_s
        else:
            self._drop = 1  # back at the current count: its first pass pays for the change
            self._interval = min(max(2 * self._interval, self.every), self.max_every)
            self._interval_s = min(2 * self._interval_s, self.max_every_s)
        self._probe = []
