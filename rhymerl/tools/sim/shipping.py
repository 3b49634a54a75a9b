"""History indexes shipped to the rollout workers: a step's indexes start shipping when it is
planned, and a worker taking up its share of the step waits for the rest of its prompts' indexes
(`SimConfig.index_bytes_per_token`, `bandwidth_bytes_per_s`)."""

from __future__ import annotations

import math

import numpy as np

from rhymerl.tools.traces.model import Trace

from .config import SimConfig
from .state import SeqQueue, SimWorker
from .timing import DecodeModel


class IndexShipping:
    """When each worker has its share's indexes, and what shipping them cost."""

    def __init__(self, trace: Trace, config: SimConfig, decode: DecodeModel, rows: list[np.ndarray]) -> None:
        self.trace = trace
        self.cfg = config
        self.decode = decode
        self.plan_time: dict[int, float] = {}
        self.shipped_bytes = 0.0
        self.ship_wait = 0.0
        """Worker-seconds spent waiting for history indexes."""
        self.index_bytes = self._index_sizes(rows) if config.index_bytes_per_token > 0 else {}

    def _index_sizes(self, rows: list[np.ndarray]) -> dict[str, float]:
        """Bytes of each prompt's index: its latest group's response tokens (over the whole trace,
        a stand-in for the previous epoch's) times the bytes per token."""
        tokens: dict[str, float] = {}
        for row in rows:
            group: dict[str, float] = {}
            for i in row.tolist():
                pid = self.trace.prompt_id[i]
                group[pid] = group.get(pid, 0.0) + float(self.trace.output_len[i])
            tokens.update(group)
        return {p: t * self.cfg.index_bytes_per_token for p, t in tokens.items()}

    def planned(self, step: int, now: float) -> None:
        """`step` was planned at `now`: its indexes start shipping."""
        self.plan_time[step] = now

    def await_indexes(self, w: SimWorker, step: int, queue: SeqQueue, now: float) -> None:
        """Hold the worker until the history indexes of its share's prompts have arrived."""
        if self.cfg.index_bytes_per_token <= 0 or self.cfg.bandwidth_bytes_per_s == math.inf:
            return
        prompts = {self.trace.prompt_id[q.sid] for q in queue}
        nbytes = sum(self.index_bytes.get(p, 0.0) for p in prompts)
        self.shipped_bytes += nbytes
        ready = self.plan_time[step] + nbytes / self.cfg.bandwidth_bytes_per_s
        self.decode.advance(w, now)
        if ready > w.clock:
            self.ship_wait += ready - w.clock
            w.clock = ready
