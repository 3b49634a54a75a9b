"""Plain data exchanged between a scheduler and whatever executes its decisions.

The same records flow between the scheduler and the simulator or the real controller, so they
carry only what both sides know: ids, lengths already generated, worker indices. Nothing here
does I/O or knows about time sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

SampleId = int
"""A sample (one response to one prompt) is identified by an int unique within a run."""

Pipeline = Literal["barrier", "per-worker", "shared"]
"""When a worker may start the next step's samples.

barrier: after every worker finished the current step (veRL-like synchronous rollout).
per-worker: as soon as this worker finished its own sub-batch (HistoPipe's hybrid pipeline).
shared: samples are pulled one by one from a shared queue (AReaL-like asynchronous rollout).
All three also respect the off-policy bound: step s starts only once step s - 1 - staleness trained.
"""


@dataclass(slots=True)
class Sample:
    """One response to generate; `generated` tokens are already done (migrated or resumed samples)."""

    sid: SampleId
    prompt_id: str
    input_len: int
    generated: int = 0
    oracle_len: int | None = None
    """True output length; only a simulator or a benchmark replaying known requests knows it, and only
    the `lpt` reference policy reads it."""


@dataclass(slots=True)
class RoundPlan:
    """Where each of a step's samples runs.

    queues[w] lists the samples worker w admits, in order; `shared` is the pull queue of the
    `shared` pipeline. Ranking fields are filled by history-aware policies for reporting.
    """

    round_no: int
    queues: list[list[SampleId]]
    shared: list[SampleId] = field(default_factory=list)
    carried: list[SampleId] = field(default_factory=list)
    ranking: str = "none"
    order: Literal["ascending", "descending", "none"] = "none"
    workers_per_group: list[int] = field(default_factory=list)
    predicted_group_time: list[float] = field(default_factory=list)

    def all_samples(self) -> list[SampleId]:
        return [sid for q in self.queues for sid in q] + list(self.shared)


@dataclass(frozen=True, slots=True)
class Watch:
    """Ask the executor to call `on_progress` once sample `sid` has generated `tokens` tokens."""

    sid: SampleId
    tokens: int


@dataclass(frozen=True, slots=True)
class Move:
    """Move one sample, keeping its generated tokens.

    dst is a worker index (intra-step migration) or None (inter-step: the sample leaves this
    step and joins the scheduler's next plan). recompute: the destination rebuilds the KV cache
    by prefilling prompt + generated tokens (RhymeRL §6.3); False means the KV cache is
    transferred in the background (RLHFSpec §6.2) and costs no decode time.
    """

    sid: SampleId
    src: int
    dst: int | None
    generated: int
    recompute: bool = True

    @property
    def kind(self) -> Literal["intra-step", "inter-step"]:
        return "inter-step" if self.dst is None else "intra-step"


@dataclass(frozen=True, slots=True)
class Rebalance:
    """Move `count` samples of `step` from worker src to dst; the executor picks the ones with the
    fewest generated tokens (waiting ones first, RLHFSpec §6.1) and reports them back with `on_moved`."""

    src: int
    dst: int
    count: int
    round_no: int


Action = Watch | Move | Rebalance

MoveReason = Literal["migrate", "rebalance", "steal", "leave"]
"""Why a sample moves: a scheduler's outlier migration (`Move`, booked when decided), a `Rebalance`,
an idle worker's steal, or its worker leaving the fleet (booked when the executor confirms them)."""
