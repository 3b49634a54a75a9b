"""The rollout fleet's records (a worker, a call, a round, a parked sample) and its calls: what the
parts of the fleet (fleet.py and the fleet_* modules beside it) share, so that no part imports the
fleet that composes them."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TypeAlias, TypeVar

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.scheduling.costmodel import TableProfile
from rhymerl.algorithms.scheduling.round_book import RoundBook
from rhymerl.workers.controller.role_apis import RolloutAPI
from rhymerl.workers.controller.transport import Handle, Indexes, Result, Stream
from rhymerl.workers.roles.samples import CallSummary, RolloutOutput, RolloutProgress, SampleRef, ScoredSample
from rhymerl.workers.rollout.generation import GenRequest

RERUNS = 3  # a sample may lose its worker this often; once more stops the run
STATE_PASSES = 4  # a Ray call's token-count reports (a scheduler acts on them), any call's shares of its tokens (passes)
SNAPSHOT_PASSES = 16  # a Ray call's snapshots of its samples' tokens (what a re-run resumes from)
ADMIT_WAIT_S = 10.0
WAIT_NOTE_S = 60.0  # how often the fleet says again that it waits for a rollout worker
CAPACITY_EVERY_S = 1.0  # how often a Ray fleet asks the cluster how many rollout pods joined
Progress: TypeAlias = RolloutProgress | Result[RolloutProgress]
"""Samples' tokens so far: a report's item (where a worker left them), or gathered here from several."""


class WorkerLost(RuntimeError):
    """A sample lost its worker more often than RERUNS, or a reward call failed that often."""


def pod_ordinal(host: str, job_name: str) -> int | None:
    """The ordinal of rollout pod `host` of job `job_name` (a StatefulSet pod's host name is its pod
    name, `<job>-rollout-<ordinal>`); None for any other host (a worker on this machine)."""
    found = re.fullmatch(re.escape(job_name) + r"-rollout-(\d+)", host)
    return int(found.group(1)) if found else None


def table_profile(cost: CostProfile, max_batch: int) -> TableProfile:
    """The scheduler's cost model from an engine's measured pass times (rollout/verify_cost.py): the
    one-token column is a decode iteration per batch size; it was measured at one context length,
    so it is taken as constant in context; prefill is priced per token from the longest pass."""
    per_token = cost.seconds[0][-1] / cost.tokens[-1]
    decode = [row[0] for row in cost.seconds]
    if len(cost.batch_sizes) < 2:
        return TableProfile.constant(decode[0], max_batch, per_token)
    return TableProfile(batch_sizes=tuple(cost.batch_sizes), context_lens=(0, 1_000_000),
                        seconds=tuple((t, t) for t in decode), prefill_seconds_per_token=per_token,
                        max_batch=max_batch)


@dataclass(eq=False)
class Member:
    """One rollout worker of the fleet."""

    id: int
    handle: Handle[RolloutAPI]
    joined: bool = False  # answered: it takes work
    slot: int = -1  # its index in the scheduler's books for the current round
    leaving: bool = False
    pod: int | None = None  # the ordinal of the rollout pod it runs on (None: not known, or not in a cluster)
    version: int | None = None  # the policy version it was last told to load
    loads: list[Result[tuple[float, bool]]] = field(default_factory=list)  # its weight loads' (seconds, fell back)


@dataclass(eq=False)
class Call:
    """One rollout call: samples on one worker (what each sample holds there: the round book)."""

    id: int
    member: Member
    round: Round
    samples: list[SampleRef]
    requests: list[GenRequest]
    indexes: Result[Indexes] | None
    version: int
    stream: Stream | None = None
    reported: bool = False  # its worker reported on it: it runs there, and hears a release
    output: Result[RolloutOutput] | None = None
    ended: bool = False  # its stream ended: with its output, or broken off
    scored: Result[list[ScoredSample]] | None = None
    summary: Result[CallSummary] | None = None


@dataclass(eq=False)
class Round:
    """One scheduling round: a plan's samples on the workers, until each is generated and scored."""

    no: int
    step: int
    epoch: int
    prompts: list[str]
    inter_step: bool
    ranking: str = "none"
    calls: list[Call] = field(default_factory=list)
    history_ok: bool | None = None
    started: float = 0.0  # wall clock
    clock0: float = 0.0  # the workers' clock at its start
    generated: float = 0.0  # wall clock when its last response was generated
    scored: float = 0.0  # ... and scored
    ends: dict[int, float] = field(default_factory=dict)  # worker id -> its clock at its last output
    workers: set[int] = field(default_factory=set)  # ids of the workers that ran calls of it
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    drafting: int = 0  # the most workers drafting for others at once (freed drafters)
    consolidations: int = 0  # workers emptied onto another so that they draft for it (freed drafters)
    summaries: list[tuple[Call, CallSummary]] = field(default_factory=list)


@dataclass
class Parked:
    """A sample in the fleet's hands: deferred to the next round, or its worker left (or died) and
    it waits for a place."""

    request: GenRequest
    resume: Progress | None
    tokens: int
    version: int
    indexes: Result[Indexes] | None
    round: Round | None = None  # the round it belongs to (None: deferred to the next)
    slot: int = -1  # the scheduler's index of the worker it left


Book: TypeAlias = RoundBook[SampleRef, Progress, Parked]
"""The fleet's round book: samples by their SampleRef, resumed from a Progress, parked as Parked."""


class Calls:
    """The fleet's calls whose streams it follows, by stream."""

    def __init__(self) -> None:
        self.by_stream: dict[int, Call] = {}
        self.reruns = 0  # calls run again after their worker (or a reward worker) died, since the step loop last read it

    def add(self, call: Call) -> None:
        self.by_stream[id(call.stream)] = call

    def drop(self, call: Call) -> None:
        self.by_stream.pop(id(call.stream), None)

    def of_stream(self, stream: object) -> Call:
        return self.by_stream[id(stream)]

    def all(self) -> list[Call]:
        return list(self.by_stream.values())

    def running(self) -> list[Call]:
        return [c for c in self.by_stream.values() if not c.ended]

    def of(self, m: Member) -> list[Call]:
        return [c for c in self.by_stream.values() if c.member is m]

    def active(self, m: Member) -> list[Call]:
        return [c for c in self.of(m) if not c.ended]

    def holding(self, slot: int, round_no: int) -> list[int]:
        """The running calls of round `round_no` on the worker at scheduler index `slot` (unless it
        leaves): whose samples the executor may move."""
        return [c.id for c in self.by_stream.values()
                if not c.ended and c.member.slot == slot and c.round.no == round_no and not c.member.leaving]


T = TypeVar("T")


def by(items: list[T], key: Callable[[T], Hashable]) -> list[list[T]]:
    """`items` in groups of equal key, in order of first appearance."""
    groups: dict[Hashable, list[T]] = {}
    for s in items:
        groups.setdefault(key(s), []).append(s)
    return list(groups.values())
