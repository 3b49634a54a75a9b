"""Fastest-of-N: per request, the draft source whose drafts that request's own tokens matched best.

Why: one drafter is not the best for every request (SPECATOR; issue 28). Every source drafts every
pass; the engine verifies the chosen source's draft, and each source is scored by how many tokens
of its own draft the emitted tokens confirm (the emitted tokens are the accepted draft plus one,
so a source that was not chosen can show at most one token more than the chosen one: enough to
take over when it keeps doing so). Scores decay geometrically; the highest score wins, ties go to
the earlier source (the caller lists them in order of preference). Pure numpy: no engine, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray


def matched(draft: Sequence[int], emitted: Sequence[int]) -> int:
    """How many leading tokens of `draft` the emitted tokens confirm."""
    n = 0
    for d, e in zip(draft, emitted, strict=False):
        if d != e:
            break
        n += 1
    return n


class SourceChoice:
    """Per request and source, a decayed mean of confirmed draft tokens per pass; picks the best."""

    def __init__(self, requests: int, sources: int, decay: float = 0.8) -> None:
        if sources < 1:
            raise ValueError(f"sources: {sources}, need at least one")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay: {decay}, need 0 <= decay < 1")
        self.decay = decay
        self.scores = np.zeros((requests, sources), dtype=np.float64)

    def observe(self, confirmed: NDArray[np.int64], rows: NDArray[np.int64] | None = None,
                asked: NDArray[np.bool_] | None = None) -> None:
        """confirmed[i, k]: tokens of source k's last draft for request rows[i] the emitted tokens confirmed;
        where `asked` is False the source was not asked for a draft, and its score stays."""
        r = np.arange(self.scores.shape[0]) if rows is None else rows
        updated = self.decay * self.scores[r] + (1.0 - self.decay) * confirmed
        self.scores[r] = updated if asked is None else np.where(asked, updated, self.scores[r])

    def choose(self, rows: NDArray[np.int64] | None = None,
               offered: NDArray[np.bool_] | None = None) -> NDArray[np.int64]:
        """The source each request drafts from this pass; with `offered` (rows x sources: which
        sources have a draft this pass) the best-scored source among those that offer one, where any does."""
        scores = self.scores if rows is None else self.scores[rows]
        if offered is not None:
            scores = np.where(offered | ~offered.any(axis=1, keepdims=True), scores, -np.inf)
        picks: NDArray[np.int64] = np.argmax(scores, axis=1)
        return picks.astype(np.int64)

    def reset(self, row: int) -> None:
        self.scores[row] = 0.0

    def resize(self, requests: int) -> None:
        """Room for `requests` rows; the scores of rows that stay are kept."""
        grown = np.zeros((requests, self.scores.shape[1]), dtype=np.float64)
        keep = min(requests, self.scores.shape[0])
        grown[:keep] = self.scores[:keep]
        self.scores = grown

    def move(self, src: NDArray[np.int64], dst: NDArray[np.int64]) -> None:
        """Requests moved from rows src[i] to dst[i]."""
        self.scores[dst] = self.scores[src]


def costly_pays(gain: float, tokens: float, pass_s: float, draft_s: float) -> bool:
    """Whether a costly source (a draft model) pays for the requests it leads this pass: `gain` more
    tokens expected from its drafts (its score over the best other source's, summed over those
    requests) for `draft_s` more seconds of drafting, against a pass that yields `tokens` in `pass_s`
    without it: tokens per second rise."""
    return (tokens + gain) * pass_s > tokens * (pass_s + draft_s)


def told_accepted(draft: Sequence[int], emitted: Sequence[int]) -> int:
    """What a source's own AIMD window is told it got accepted: its whole draft when the emitted tokens
    did not refute it (they check only as far as the verified draft was accepted, plus one), else the
    confirmed prefix."""
    confirmed = matched(draft, emitted)
    return len(draft) if confirmed == min(len(draft), len(emitted)) else confirmed
