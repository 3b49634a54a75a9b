"""Pure-Python references for the native HistoSpec code: obviously correct, slow, used by tests only.

They restate the rules from scratch over the raw token lists (scan every occurrence, group by the
next token), with no automaton, so agreement with the native index is evidence of both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

REWARD_SCALE = 1048576.0  # 2^20, the native quantisation of shifted rewards


def reward_weights(rewards: Sequence[float], reward_weighted: bool) -> list[int]:
    """Integer weight per response: 1 + shifted, scaled, rounded reward; 1 when ranking by frequency."""
    if not reward_weighted or not rewards:
        return [1] * len(rewards)
    lo, hi = min(rewards), max(rewards)
    if hi <= lo:
        return [1] * len(rewards)
    return [1 + math.floor((r - lo) / (hi - lo) * REWARD_SCALE + 0.5) for r in rewards]


class ReferenceIndex:
    def __init__(self, responses: Sequence[tuple[Sequence[int], float]], reward_weighted: bool = False) -> None:
        self.seqs = [list(tokens) for tokens, _ in responses]
        self.weights = reward_weights([float(r) for _, r in responses], reward_weighted)

    def occurrences(self, pattern: Sequence[int]) -> list[tuple[int, int]]:
        """(response, end) for every occurrence; end is the index just past the pattern."""
        k = len(pattern)
        pat = list(pattern)
        return [
            (r, j + k)
            for r, seq in enumerate(self.seqs)
            for j in range(len(seq) - k + 1)
            if seq[j : j + k] == pat
        ]

    def priority(self, pattern: Sequence[int]) -> tuple[int, int] | None:
        occ = self.occurrences(pattern)
        if not occ:
            return None
        return sum(self.weights[r] for r, _ in occ), len(occ)

    def walk(self, occ: list[tuple[int, int]], max_tokens: int, min_prob: float) -> list[int]:
        """Follow the highest-priority next token from the occurrences `occ` of the matched string.

        A token's probability is the weight of the occurrences it continues over the weight of all
        occurrences; with min_prob > 0 the draft stops before the path probability drops below it.
        """
        out: list[int] = []
        prob = 1.0
        while len(out) < max_tokens:
            live = [(r, e) for r, e in occ if e < len(self.seqs[r])]
            if not live:
                break
            groups: dict[int, tuple[int, int]] = {}
            for r, e in live:
                t = self.seqs[r][e]
                w, c = groups.get(t, (0, 0))
                groups[t] = (w + self.weights[r], c + 1)
            tok = max(groups, key=lambda t: (groups[t][0], groups[t][1], -t))
            prob *= groups[tok][0] / sum(self.weights[r] for r, _ in occ)
            if min_prob > 0 and prob < min_prob:
                break
            out.append(tok)
            occ = [(r, e + 1) for r, e in live if self.seqs[r][e] == tok]
        return out

    def draft(
        self,
        context: Sequence[int],
        max_tokens: int,
        prefix_max: int = 7,
        prefix_min: int = 3,
        min_prob: float = 0.0,
    ) -> list[int]:
        if max_tokens == 0:
            return []
        n = len(context)
        for k in range(min(prefix_max, n), prefix_min - 1, -1):
            occ = self.occurrences(context[n - k :])
            if any(e < len(self.seqs[r]) for r, e in occ):
                return self.walk(occ, max_tokens, min_prob)
            # absent, or only at the very end of responses: try a shorter prefix
        return []


def oracle_accepted(index: ReferenceIndex, response: Sequence[int], prefix: int) -> int:
    """RhymeRL §5.1: at each point whose last `prefix` tokens occur, accept the longest continuation
    that occurs after them anywhere in the history, then generate one token."""
    accepted, pos, n = 0, 0, len(response)
    resp = list(response)
    while pos < n:
        start = pos - prefix
        if start >= 0 and (prefix == 0 or index.occurrences(resp[start:pos])):
            while pos < n and index.occurrences(resp[start : pos + 1]):
                pos += 1
                accepted += 1
        pos += 1
    return accepted


class ReferenceDrafter:
    """One sequence's AIMD drafting state over a ReferenceIndex."""

    def __init__(
        self,
        index: ReferenceIndex,
        prefix_max: int = 7,
        prefix_min: int = 3,
        window_initial: int = 2,
        window_step: int = 2,
        window_max: int = 32,
        min_prob: float = 0.0,
    ) -> None:
        self.index = index
        self.min_prob = min_prob
        self.prefix_max, self.prefix_min = prefix_max, prefix_min
        self.initial, self.step, self.max = window_initial, window_step, window_max
        self.context: list[int] = []
        self.window = window_initial
        self.last_draft = 0

    def feed(self, tokens: Sequence[int]) -> None:
        self.context.extend(tokens)

    def draft(self) -> list[int]:
        out = self.index.draft(self.context, self.window, self.prefix_max, self.prefix_min, self.min_prob)
        self.last_draft = len(out)
        return out

    def report(self, accepted: int) -> None:
        if self.last_draft:
            self.window = min(self.window + self.step, self.max) if accepted == self.last_draft else self.initial
        self.last_draft = 0


def ngram_draft(context: Sequence[int], window: int, min_n: int, max_n: int) -> list[int]:
    """The n-gram baseline: most recent longest earlier occurrence of the context's suffix (<= max_n)."""
    n = len(context)
    best_len, best_end = 0, 0
    if n >= 2 and window > 0:
        for j in range(n - 2, -1, -1):  # j: end of an earlier occurrence (its last token)
            m = 0
            while m < max_n and m <= j and context[j - m] == context[n - 1 - m]:
                m += 1
            if m > best_len:
                best_len, best_end = m, j
                if m >= max_n:
                    break
    if best_len < min_n:
        return []
    return list(context[best_end + 1 : min(n, best_end + 1 + window)])
