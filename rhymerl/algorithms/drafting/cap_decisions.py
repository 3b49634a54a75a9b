"""The draft cap each pass ran under and why, counted by batch-size band: what a step's metrics show
of how the cap follows the batch as a round's tail drains (a batch of hundreds early, a few
sequences at the end), so a cap that never drafts where it should, or drafts where it costs, is
seen in the run rather than guessed from its throughput.

Bands are powers of two (1, 2-3, 4-7, ...): a cost profile prices drafts differently only as the
batch grows by a factor. A record adds up (`+`): the calls of a step on several workers, the
passes of one call in any split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

Reason = Literal["priced", "priced-off", "parked", "probe", "no-draft", "fixed-off", "unpriced"]
"""Why a pass ran under its cap: the cost model chose a cap > 0 (`priced`) or 0 (`priced-off`);
the pass ran plain without asking, after an off choice (`parked`); it drafted at the initial window
to keep the estimates current although the choice was off (`probe`); no sequence had a draft on
offer (`no-draft`); the batch was above `speculation.disableAboveBatch` (`fixed-off`); no cost
profile priced it, so the full window (`unpriced`)."""
REASONS: tuple[Reason, ...] = get_args(Reason)
DRAFTING: frozenset[Reason] = frozenset({"priced", "probe", "unpriced"})
"""The reasons of passes that draft (cap > 0); every other runs plain (cap 0)."""
_NAMED: dict[str, Reason] = {r: r for r in REASONS}
_PREFIX = "cap "
K = TypeVar("K")


def band(batch: int) -> int:
    """The band of a batch of `batch` sequences: the power of two at or below it (1 for an empty batch)."""
    return 1 << (max(batch, 1).bit_length() - 1)


def band_label(low: int) -> str:
    """`1`, `2-3`, `4-7`, ...: the batch sizes of the band starting at `low`."""
    return "1" if low == 1 else f"{low}-{2 * low - 1}"


def _band_of_label(label: str) -> int:
    low = int(label.split("-", 1)[0])
    if low < 1 or band(low) != low or band_label(low) != label:
        raise ValueError(f"{label!r}: not a batch-size band")
    return low


def _added(a: Mapping[K, int], b: Mapping[K, int]) -> dict[K, int]:
    out = dict(a)
    for k, n in b.items():
        out[k] = out.get(k, 0) + n
    return out


@dataclass
class CapDecisions:
    """Passes by (band, reason), and per band the sum of the caps its drafting passes ran under."""

    passes: dict[tuple[int, Reason], int] = field(default_factory=dict)
    cap_sums: dict[int, int] = field(default_factory=dict)

    def record(self, batch: int, reason: Reason, cap: int = 0) -> None:
        """One pass over `batch` sequences, why it ran under `cap` (0 for a plain pass)."""
        if (reason in DRAFTING) != (cap > 0):
            raise ValueError(f"a {reason!r} pass with cap {cap}: {', '.join(sorted(DRAFTING))} draft, the rest do not")
        low = band(batch)
        self.passes[low, reason] = self.passes.get((low, reason), 0) + 1
        if cap:
            self.cap_sums[low] = self.cap_sums.get(low, 0) + cap

    def __add__(self, other: CapDecisions) -> CapDecisions:
        return CapDecisions(_added(self.passes, other.passes), _added(self.cap_sums, other.cap_sums))

    def to_json(self) -> dict[str, int]:
        """Flat counts, `"cap 4-7 priced": passes` and `"cap 4-7 sum": caps`, so that the record rides in
        any mapping of counters (the vLLM proposer's stats)."""
        out = {f"{_PREFIX}{band_label(low)} {reason}": n for (low, reason), n in sorted(self.passes.items())}
        return out | {f"{_PREFIX}{band_label(low)} sum": n for low, n in sorted(self.cap_sums.items())}

    @classmethod
    def from_json(cls, data: Mapping[str, int]) -> CapDecisions:
        """The record `to_json` gave; keys not starting with `cap ` are someone else's and left alone."""
        out = cls()
        for key, n in data.items():
            if not key.startswith(_PREFIX):
                continue
            label, what = key.removeprefix(_PREFIX).split(" ", 1)
            low = _band_of_label(label)
            if what == "sum":
                out.cap_sums[low] = int(n)
            elif (reason := _NAMED.get(what)) is not None:
                out.passes[low, reason] = int(n)
            else:
                raise ValueError(f"{key!r}: not a cap decision")
        return out

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per band that had passes, smallest first: its `passes`, the share that `drafted`, the mean
        `cap` of those (None: none drafted), the most frequent `reason` (ties: in REASONS' order) and
        the passes of each reason."""
        out: dict[str, dict[str, Any]] = {}
        for low in sorted({b for b, _ in self.passes}):
            reasons = {r: self.passes[low, r] for r in REASONS if (low, r) in self.passes}
            total = sum(reasons.values())
            drafted = sum(n for r, n in reasons.items() if r in DRAFTING)
            out[band_label(low)] = {
                "passes": total,
                "drafted": round(drafted / total, 4),
                "cap": round(self.cap_sums.get(low, 0) / drafted, 2) if drafted else None,
                "reason": max(reasons, key=lambda r: (reasons[r], -REASONS.index(r))),
                "reasons": reasons,
            }
        return out
