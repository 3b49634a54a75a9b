"""What last epoch's rollouts say about this epoch's lengths (RhymeRL §6.1).

Responses to the same prompt keep similar lengths from one epoch to the next, so the lengths a
prompt produced the last time it was sampled predict its load now. This store keeps, per prompt,
the lengths of its latest group of responses and how much that group grew against the previous
one (the growth rates that set the migration factor lambda, §6.3).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

RECENT = 16_384
"""Response lengths of any prompt kept for prompts never seen (`LengthHistory.recent`)."""


class LengthHistory:
    """Per prompt: the latest group's response lengths, and the growth of its median; and the latest
    `recent` lengths of all prompts together, what a prompt never seen is predicted from (jobs whose
    prompt ids never recur have nothing else)."""

    def __init__(self, recent: int = RECENT) -> None:
        self._lengths: dict[str, NDArray[np.float64]] = {}
        self._growth: dict[str, float] = {}
        self._recent: deque[float] = deque(maxlen=recent)

    def __len__(self) -> int:
        return len(self._lengths)

    def __contains__(self, prompt_id: object) -> bool:
        return prompt_id in self._lengths

    def observe(self, prompt_id: str, lengths: Sequence[int] | NDArray[np.int64]) -> None:
        """Record one finished group of responses; it replaces the prompt's previous group."""
        arr = np.asarray(lengths, dtype=np.float64)
        if arr.size == 0:
            return
        old = self._lengths.get(prompt_id)
        if old is not None:
            old_median = float(np.median(old))
            if old_median > 0:
                self._growth[prompt_id] = float(np.median(arr)) / old_median
        self._lengths[prompt_id] = arr
        self._recent.extend(arr.tolist())

    def observe_many(self, groups: Iterable[tuple[str, Sequence[int]]]) -> None:
        for prompt_id, lengths in groups:
            self.observe(prompt_id, lengths)

    def lengths(self, prompt_id: str) -> NDArray[np.float64] | None:
        return self._lengths.get(prompt_id)

    def recent(self) -> NDArray[np.float64]:
        """The latest response lengths observed, of every prompt, oldest first."""
        return np.fromiter(self._recent, dtype=np.float64, count=len(self._recent))

    def median(self, prompt_id: str) -> float | None:
        """The GRPO group's median length: HistoPipe's ranking key (§6.2)."""
        arr = self._lengths.get(prompt_id)
        return None if arr is None else float(np.median(arr))

    def max(self, prompt_id: str) -> float | None:
        arr = self._lengths.get(prompt_id)
        return None if arr is None else float(np.max(arr))

    def growth_lambda(self, percentile: float, floor: float) -> float:
        """lambda of §6.3: the given percentile of the latest per-prompt median growth rates, at least `floor`."""
        if not self._growth:
            return floor
        return max(floor, float(np.percentile(np.fromiter(self._growth.values(), dtype=np.float64), percentile)))
