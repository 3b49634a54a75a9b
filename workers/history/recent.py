"""The run's newest responses to any prompt, indexed as one history: what a prompt without history of
its own drafts from (every prompt in epoch 1).

Why: HistoSpec drafts a prompt only from its own previous epoch, so epoch 1 drafts only from the
siblings generated beside it, which run level with it (about 1.3 tokens per pass on the quickstart).
Responses to other prompts share the task's format and phrasing; an index over the newest of them
(suffix decoding's global tree, here a HistoSpec index) drafts from the first step on
(benchmarks/group-drafts/recent). The window keeps the newest whole responses, in the order the
steps were recorded, up to a token budget, so a resumed run that records its dumps again keeps the
same window, and its index is rebuilt once, when next asked for, not once per step recorded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

from rhymerl.algorithms.drafting.index import HistoryIndex


class RecentResponses:
    def __init__(self, budget: int, reward_weighted: bool = False) -> None:
        """budget: most tokens kept (the newest whole responses that fit; 0 keeps none)."""
        if budget < 0:
            raise ValueError(f"budget {budget}: must be >= 0")
        self.budget = budget
        self.reward_weighted = reward_weighted
        self.window: deque[tuple[NDArray[np.int32], float]] = deque()
        self.tokens = 0
        self._index: HistoryIndex | None = None
        self._stale = False

    def add(self, responses: Iterable[tuple[Sequence[int] | NDArray[np.int32], float]]) -> None:
        """(tokens, reward) in the order they were recorded; the oldest leave once the budget is
        passed. A response longer than the budget is never kept."""
        for response, reward in responses:
            tokens = np.asarray(response, dtype=np.int32)
            if tokens.size == 0 or tokens.size > self.budget:
                continue
            self.window.append((tokens, float(reward)))
            self.tokens += int(tokens.size)
            self._stale = True
        while self.tokens > self.budget:
            old, _ = self.window.popleft()
            self.tokens -= int(old.size)

    def index(self) -> HistoryIndex | None:
        """The window's index (None while it is empty), built once per change."""
        if self._stale:
            self._index = HistoryIndex.build(self.window, reward_weighted=self.reward_weighted) if self.window else None
            self._stale = False
        return self._index
