"""What a rollout engine is asked (a GenRequest under SamplingParams) and what it returns (a GenResult,
with a SourceCount per draft source), as plain records. They cross processes (rollout, reward and
history workers, the step loop), so they live apart from the engines: reading them needs no torch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    max_response_length: int = 640


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: list[int]
    sample_id: int
    prompt_id: str = ""


@dataclass
class SourceCount:
    """What one draft source did for one response: passes that verified its draft, its tokens drafted
    there, and how many of them verification accepted."""

    passes: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, other: SourceCount) -> None:
        self.passes += other.passes
        self.drafted += other.drafted
        self.accepted += other.accepted


def merged_counts(counts: Iterable[Mapping[str, SourceCount]]) -> dict[str, SourceCount]:
    """Per source, the sum of several responses' counts."""
    out: dict[str, SourceCount] = {}
    for by_source in counts:
        for name, count in by_source.items():
            out.setdefault(name, SourceCount()).add(count)
    return out


@dataclass
class GenResult:
    response_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    forward_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    by_source: dict[str, SourceCount] = field(default_factory=dict)
    """The drafted and accepted tokens split by the source that drafted them (source_of)."""
    logprobs: list[float] | None = None
    """Each response token's log-probability under the distribution it was drawn from (after
    temperature and top-p: the behaviour policy); None where an engine could not report every one."""
