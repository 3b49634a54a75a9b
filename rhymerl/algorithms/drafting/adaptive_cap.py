"""Adaptive speculation: choose each pass's draft-length cap (0 = off) to maximise tokens per second.

Model (RhymeRL §5.4, RLHFSpec §5, SPECATOR §4.1). A verify pass over B sequences that each append
1 + k tokens costs t(B, k), profiled on this machine (workers/rollout/verify_cost.py). Draft position
j is accepted only if positions 1..j-1 were, with conditional probability p_j, tracked online from
what verification actually accepted. A sequence given a draft of k tokens then emits

    E(k) = 1 + sum_{j=1..k} prod_{i<=j} p_i

tokens per pass (the 1 is the token the target model samples anyway). Each pass the drafter first
proposes at every sequence's own AIMD window (draft length n_i, cheap); the cap k then truncates
the drafts to min(n_i, k), and is chosen to maximise

    sum_i E(min(n_i, k)) / (t(B, 1 + sum_i min(n_i, k) / B) + c)

(the engine computes only the real tokens of a ragged block, so a pass is priced at its mean
tokens per sequence; any draft puts the whole pass on the verify path, so between 1 and 2 tokens
t starts from a verify pass of one token per sequence, CostProfile.verify_one). c is measured
online: what real passes cost beyond the profile's prediction, with drafts and without
(CostCalibration; the profile times the forward pass alone, not the engine's bookkeeping,
sampling and drafting). k = 0 (plain decoding) wins when drafts are poor or the batch is so
large that verifying extra tokens costs more than it returns.

The profile corrects itself from the passes it prices (CostEvidence). What is observed is the
time from one pass's choice to the next: the forward pass plus everything else the engine did
in between (sampling, bookkeeping, drafting, now and then a prefill). That time is never less
than the forward pass alone, and a forward pass never costs less with more sequences or more
tokens per sequence; so a pass over B sequences appending n tokens each, seen to take m
seconds, proves t(b, j) <= m for every grid cell with b <= B and j <= n (and the verify column
for b <= B once the pass drafted). Interference only ever adds time, so a cell is lowered to the
smallest such bound (the `confirm`-th smallest, so one mis-recorded pass cannot move it alone)
and never raised: a cell measured 10x too slow is corrected as soon as a few passes land at or
above it, and noise above the floor changes nothing (once the passes show the measurement
disturbed, the cells they bound only loosely or not at all follow the disturbance they showed,
so long drafts are not priced at the spoiled values meanwhile). A lowered cell then carries some
of the pass overhead, which the calibration stops counting: c is always priced against the
corrected profile, and it is never negative (a pass faster than predicted is the grid's error,
corrected per cell; it is not "explained" by a negative overhead that would make every other
pass look cheaper). verify_cost.ProfileStore keeps the evidence across runs and re-measures the
cells it shows were measured disturbed.
"""

from __future__ import annotations

import functools
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

CAPS = (0, 1, 2, 4, 8, 16, 32)


@dataclass
class AcceptanceTracker:
    """Online estimate of p_j = P(draft token j accepted | tokens 1..j-1 accepted).

    Counts decay per pass, so the estimate follows the policy and the batch as they change. A
    position with few tests leans on its predecessor's estimate (weight `prior_weight`), the first
    one on `prior`: positions beyond the caps chosen lately are rarely tested, and shrinking them
    to a fixed prior would make longer caps look worse than the evidence says and keep them unused.
    """

    max_len: int = 32
    decay: float = 0.98
    prior: float = 0.5
    prior_weight: float = 2.0
    offered: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    taken: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        self.offered = np.zeros(self.max_len)
        self.taken = np.zeros(self.max_len)

    def observe(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """One verify pass: per sequence, draft tokens proposed and how many were accepted."""
        d = np.asarray(drafted, dtype=np.int64)
        a = np.asarray(accepted, dtype=np.int64)
        if d.shape != a.shape:
            raise ValueError("drafted and accepted must have one entry per sequence")
        self.offered *= self.decay
        self.taken *= self.decay
        # position j (0-based) was tested when all earlier ones were accepted (j <= a, j < d) and
        # accepted when j < a: counts of sequences reaching past j, by reverse cumulative sums
        tested = np.bincount(np.minimum(np.minimum(a + 1, d), self.max_len), minlength=self.max_len + 1)
        taken = np.bincount(np.minimum(a, self.max_len), minlength=self.max_len + 1)
        self.offered += tested[::-1].cumsum()[::-1][1:]
        self.taken += taken[::-1].cumsum()[::-1][1:]

    def conditional(self) -> list[float]:
        out, lean = [], self.prior
        for t, o in zip(self.taken.tolist(), self.offered.tolist(), strict=True):
            lean = (t + self.prior_weight * lean) / (o + self.prior_weight)
            out.append(lean)
        return out

    def gains(self, k: int) -> list[float]:
        """[E(0), ..., E(k)] from one pass over the conditional chain."""
        out, total, run = [1.0], 1.0, 1.0
        for p in self.conditional()[:k]:
            run *= p
            total += run
            out.append(total)
        return out + [total] * (k + 1 - len(out))  # positions past max_len add nothing

    def expected_tokens(self, k: int) -> float:
        """E(k): tokens a sequence emits per pass with a draft of k tokens."""
        return self.gains(k)[k]


@dataclass(frozen=True)
class CostProfile:
    """Seconds per forward pass on a (batch sizes x tokens per sequence) grid; interpolated in between.

    `verify_one` (per batch size, optional) is a verify pass in which every sequence appends one
    token: what a pass costs as soon as any sequence carries a draft. The engine runs such a pass
    down its verify path (on CPU in float32 the native attention kernel, elsewhere a masked
    attention), which need not cost what the one-token path of plain decoding does, so a pass
    with a few short drafts is priced between verify_one and the grid's next column, not between
    plain and that column.
    """

    batch_sizes: tuple[int, ...]
    tokens: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]  # [batch index][tokens index]
    verify_one: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if list(self.batch_sizes) != sorted(set(self.batch_sizes)) or list(self.tokens) != sorted(set(self.tokens)):
            raise ValueError("profile grid axes must be strictly increasing")
        if len(self.seconds) != len(self.batch_sizes) or any(len(r) != len(self.tokens) for r in self.seconds):
            raise ValueError("profile seconds must be a batch_sizes x tokens grid")
        if self.verify_one is not None and len(self.verify_one) != len(self.batch_sizes):
            raise ValueError("profile verify_one needs one entry per batch size")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostProfile:
        """The profile `dataclasses.asdict` gave (lists where it holds tuples, e.g. after JSON)."""
        verify = data.get("verify_one")
        return cls(tuple(data["batch_sizes"]), tuple(data["tokens"]), tuple(tuple(r) for r in data["seconds"]),
                   tuple(verify) if verify is not None else None)

    @functools.cached_property
    def _verify_grid(self) -> tuple[tuple[float, ...], ...]:
        """The grid with its 1-token column replaced by verify_one, kept between the plain 1-token
        cost and the next column (as `profile.monotone` keeps the grid: more tokens never cost less)."""
        if self.verify_one is None or self.tokens[0] != 1 or len(self.tokens) < 2:
            return self.seconds
        return tuple((min(max(v, row[0]), row[1]), *row[1:]) for v, row in zip(self.verify_one, self.seconds,
                                                                               strict=True))

    def cost(self, batch: int, tokens_per_seq: float) -> float:
        next_column = self.tokens[1] if len(self.tokens) > 1 else self.tokens[0]
        grid = self._verify_grid if 1 < tokens_per_seq < next_column else self.seconds  # only that interval moves
        return _interp2(self.batch_sizes, self.tokens, grid, batch, tokens_per_seq)


def _interp1(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0] * (x / xs[0] if xs[0] else 1.0) if x > 0 else ys[0]
    if x >= xs[-1]:
        if len(xs) == 1:
            return ys[-1]
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (x - xs[-1])
    i = bisect_left(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _interp2(bs: Sequence[int], ts: Sequence[int], grid: Sequence[Sequence[float]], b: float, t: float) -> float:
    per_batch = [_interp1(ts, row, t) for row in grid]
    return max(_interp1(bs, per_batch, b), 1e-9)


def choose_cap(profile: CostProfile, batch: int, tracker: AcceptanceTracker, lengths: Sequence[int] | None = None,
               caps: Sequence[int] = CAPS, limit: int = 32, calibration: CostCalibration | None = None) -> int:
    """The draft cap with the highest expected tokens per second for `batch` running sequences.

    `lengths` are the drafts the sequences have on offer this pass (the drafter's AIMD windows and
    index matches decide them; sequences without a draft source are left out). A cap k truncates
    each to min(length, k). Without `lengths` every sequence is assumed to draft the full cap.
    `calibration` adds what real passes cost beyond the profile, with drafts and without.
    """
    if lengths is None:
        offered = None
        longest = limit
    else:
        offered = np.asarray(lengths, dtype=np.int64)
        longest = int(offered.max()) if offered.size else 0
    gain = np.asarray(tracker.gains(min(longest, limit)))
    best, best_rate = 0, -1.0
    for k in caps:
        if k > limit:
            break
        if offered is None:
            drafted, tokens = k * batch, batch * float(gain[k])
        else:
            drafts = np.minimum(offered, k)
            drafted, tokens = int(drafts.sum()), batch - offered.size + float(gain[drafts].sum())
        seconds = profile.cost(batch, (batch + drafted) / batch)
        if calibration is not None:
            seconds += calibration.extra(drafted > 0)
        rate = tokens / seconds
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = k, rate
        if offered is not None and k >= longest:
            break
    return best


@dataclass
class CostCalibration:
    """What a real pass costs beyond the profile's prediction, tracked apart for passes with
    drafts and without.

    The profile times the model's forward pass alone. A real pass also runs the engine's
    bookkeeping and prefills, samples every appended token, asks the drafter for drafts and feeds
    it what was emitted. Much of that is paid once per pass whatever its size, so it is tracked as
    seconds added to a pass (an EMA of measured minus predicted) rather than as a factor: a fixed
    per-pass cost makes appending tokens relatively cheaper, which a factor would hide. Drafting
    and sampling more tokens make the speculative side dearer than the plain one.
    """

    alpha: float = 0.05
    spec: float | None = None
    plain: float | None = None

    def observe(self, speculative: bool, measured: float, predicted: float) -> None:
        if not 0.25 * predicted <= measured <= 5.0 * predicted:  # a gap between rollouts or a stall, not a pass
            return
        excess = max(0.0, measured - predicted)  # below the prediction: the grid's error (CostEvidence)
        old = self.spec if speculative else self.plain
        new = excess if old is None else (1 - self.alpha) * old + self.alpha * excess
        if speculative:
            self.spec = new
        else:
            self.plain = new

    def extra(self, speculative: bool) -> float:
        """Seconds to add to a predicted pass. A side not seen yet is priced at the least it could
        cost, so that the choice tries it and it is measured: a speculative pass at the plain
        side's overhead (it runs all a plain pass does), a plain pass at none. Priced at the
        speculative side's overhead instead, plain decoding would look as dear as drafting
        whatever drafting adds, and where drafts are on offer from the first pass it would never
        run and never be measured."""
        if speculative:
            return self.spec if self.spec is not None else self.plain if self.plain is not None else 0.0
        return self.plain if self.plain is not None else 0.0


INCONSISTENT = 0.5
"""A cell whose confirmed bound is below this fraction of its measured value was measured
disturbed: real passes, overheads included, already run in half its time."""


@dataclass
class CostEvidence:
    """Per-cell upper bounds on a profile from the passes it priced, and the profile they correct.

    Cells are the grid's (batch x tokens) plus a last column for `verify_one`. Each cell keeps its
    `confirm` smallest bounds; the corrected profile takes, per cell, the smaller of the base value
    and the `confirm`-th smallest bound (see the module docstring for why a pass bounds cells).
    Bounds are monotone in both axes by construction, so the corrected grid stays monotone when
    the base is.

    Passes only reach the cells at or below the shapes they run, and bound the small cells under
    them loosely (a pass over 64 sequences says little about one sequence's cost); yet a cap is
    chosen from the cells above and beside them: a grid measured disturbed but corrected only
    where passes ran tightly would price longer drafts and smaller batches at the disturbed values
    and never try them. So once the evidence shows the base disturbed (at least two confirmed
    bounds under INCONSISTENT of their cell's base value, and at least half of the bounds under
    their base value so),
    every cell is taken at its base value times the median ratio bound / base of the disturbed
    ones, or at its own bound where that is lower, kept monotone, until a new measurement
    (`rebase`) tells better.
    """

    base: CostProfile
    confirm: int = 3
    _bounds: NDArray[np.float64] = field(init=False, repr=False)
    _cells: NDArray[np.float64] = field(init=False, repr=False)
    _profile: CostProfile | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if self.confirm < 1:
            raise ValueError("confirm: at least 1 observation")
        self._bounds = np.full((self.confirm, len(self.base.batch_sizes), len(self.base.tokens) + 1), np.inf)
        self._cells = self._corrected()

    def observe(self, batch: int, tokens_per_seq: float, seconds: float) -> bool:
        """A pass over `batch` sequences appending `tokens_per_seq` tokens each (on average) took
        `seconds`, start to start; returns whether the corrected profile changed."""
        rows = bisect_right(self.base.batch_sizes, batch)
        cols = list(range(bisect_right(self.base.tokens, tokens_per_seq + 1e-9)))
        if tokens_per_seq > 1 and self.base.verify_one is not None:
            cols.append(len(self.base.tokens))
        if not rows or not cols or not np.isfinite(seconds) or seconds <= 0:
            return False
        region = self._bounds[:, :rows, cols]
        if seconds >= region[-1].max():
            return False
        stacked = np.concatenate([region, np.full((1, *region.shape[1:]), seconds)])
        stacked.sort(axis=0)
        self._bounds[:, :rows, cols] = stacked[: self.confirm]
        after = self._corrected()
        if np.array_equal(after, self._cells):
            return False
        self._cells = after
        self._profile = None
        return True

    def _corrected(self) -> NDArray[np.float64]:
        base, bound = profile_cells(self.base), self._bounds[-1]
        cells = np.minimum(base, bound)
        informative = bound < base  # a bound above the base value says nothing either way
        low = bound < INCONSISTENT * base
        if int(low.sum()) >= 2 and 2 * int(low.sum()) >= int(informative.sum()):
            cells = np.minimum(bound, base * float(np.median(bound[low] / base[low])))
            cells[:, :-1] = np.maximum.accumulate(cells[:, :-1], axis=1)  # more tokens never cost less
            cells = np.maximum.accumulate(cells, axis=0)                  # nor do more sequences
        return np.asarray(cells, dtype=np.float64)

    @property
    def bounds(self) -> NDArray[np.float64]:
        """The confirmed bound per cell (batch x tokens + verify column); inf where not confirmed."""
        return np.array(self._bounds[-1], dtype=np.float64)

    @property
    def profile(self) -> CostProfile:
        if self._profile is None:
            self._profile = cells_profile(self.base, self._cells)
        return self._profile

    def rebase(self, base: CostProfile) -> None:
        """A new base profile on the same axes (cells re-measured); the bounds seen so far still hold."""
        if (base.batch_sizes, base.tokens) != (self.base.batch_sizes, self.base.tokens):
            raise ValueError("rebase: the new profile must have the same grid axes")
        self.base = base
        self._cells = self._corrected()
        self._profile = None


def profile_cells(profile: CostProfile) -> NDArray[np.float64]:
    """The profile as one array, batch x (tokens + verify column); inf where it has no verify_one."""
    verify = profile.verify_one if profile.verify_one is not None else (np.inf,) * len(profile.batch_sizes)
    return np.column_stack([np.asarray(profile.seconds, dtype=np.float64).reshape(len(profile.batch_sizes), -1),
                            np.asarray(verify, dtype=np.float64)])


def cells_profile(like: CostProfile, cells: NDArray[np.float64]) -> CostProfile:
    """`cells` (as profile_cells lays them out) on `like`'s axes."""
    verify = None if like.verify_one is None else tuple(float(v) for v in cells[:, -1])
    return CostProfile(like.batch_sizes, like.tokens, tuple(tuple(float(v) for v in row[:-1]) for row in cells),
                       verify)
