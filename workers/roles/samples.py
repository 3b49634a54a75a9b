"""What role workers and the step loop exchange about samples: names, a rollout call's progress
and output, scored samples and the few numbers per sample the loop keeps."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from rhymerl.algorithms.drafting.cap_decisions import CapDecisions
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SourceCount
from rhymerl.workers.rollout.group_drafts import GrownTokens


@dataclass(frozen=True)
class SampleRef:
    """Which response a request is: prompt, sample index within its group, and the epoch of the
    group (an outlier deferred past an epoch's end runs beside the next epoch's visit of its prompt)."""

    prompt_id: str
    index: int
    epoch: int


GroupKey = tuple[int, str]
"""A group of responses: (epoch, prompt id)."""


@dataclass(frozen=True)
class RolloutCall:
    """One rollout call: samples for a rollout worker to generate, with what it needs to do so."""

    id: int
    samples: list[SampleRef]
    requests: list[GenRequest]
    step: int
    """The training step the samples are for (fault points; a worker's metrics)."""
    report_every: int | None = None
    """Engine passes between reports of every sample's token count ("state"); None: only with the
    snapshots and the output."""
    snapshot_every: int | None = None
    """Engine passes between snapshots of every sample's tokens ("progress", what a re-run of the
    call after its worker died resumes from); None: none."""
    share_every: int | None = None
    """Engine passes between reports that also carry the tokens each sample generated since the
    last such report (`grown`; the output carries the rest): the step loop relays them to the calls
    running the same groups on other workers (group drafts). None: no tokens shared."""


@dataclass
class RolloutOutput:
    """One rollout call's finished responses (in request order), the policy version that generated them."""

    samples: list[SampleRef]
    results: list[GenResult]
    policy_version: int
    seconds: float
    speculated: bool  # history drafts were available for this call
    resumed_tokens: int  # tokens the samples brought from elsewhere (a lost call's progress, a move)
    heard_tokens: int = 0  # tokens of siblings on other workers its group indexes took in (group drafts)
    cap_decisions: CapDecisions = field(default_factory=CapDecisions)  # its passes' draft caps and why


@dataclass
class RolloutProgress:
    """Partial results by sample: what a re-run of a lost call, or the call that takes over samples
    another call handed back, resumes from."""

    results: dict[SampleRef, GenResult]


@dataclass(frozen=True)
class _Compact:
    """Pickled as its class and its fields' values in order, no field names: a rollout stream's
    tags cross the network once per report."""

    def __reduce__(self) -> tuple[type[_Compact], tuple[object, ...]]:
        return type(self), tuple(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class CallState(_Compact):
    """What a rollout call reports: the tokens each unfinished sample has so far (waiting ones
    included, at 0) and the length of each finished one; with `share_every`, the tokens its
    samples generated since they were last shared (None: none)."""

    running: dict[SampleRef, int]
    finished: dict[SampleRef, int]
    grown: GrownTokens | None = None


@dataclass(frozen=True)
class Handback(_Compact):
    """Samples a running call handed back, their partial results in the item before it: those the
    step loop asked for (`release`) that were still unfinished, with how many tokens each has, and
    those asked for that had finished (`missed`); `leaving`: the worker is leaving the fleet and
    handed back every unfinished sample."""

    handed: dict[SampleRef, int]
    missed: list[SampleRef]
    leaving: bool = False


@dataclass(frozen=True)
class StateTag(_Compact):
    """After a None item: the call's token counts (every `report_every` passes)."""

    state: CallState


@dataclass(frozen=True)
class ProgressTag(_Compact):
    """After a RolloutProgress snapshot of every sample's tokens (every `snapshot_every` passes)."""

    state: CallState


@dataclass(frozen=True)
class HandbackTag(_Compact):
    """After the RolloutProgress of the samples handed back."""

    handback: Handback


@dataclass(frozen=True)
class OutputTag(_Compact):
    """After the call's RolloutOutput, its last report."""

    state: CallState


Tag = StateTag | ProgressTag | HandbackTag | OutputTag
"""What the item before it in a rollout stream was, by its type: the stream alternates items
(bulk, kept by reference across the network) and tags (small, read by the step loop)."""


@dataclass
class ScoredSample:
    sample: SampleRef
    result: GenResult
    reward: float
    error: str | None
    policy_version: int


@dataclass(frozen=True)
class SampleSummary:
    """What the step loop learns of a scored response."""

    sample: SampleRef
    length: int
    reward: float
    error: str | None
    drafted: int
    accepted: int
    forward_passes: int
    by_source: dict[str, SourceCount] = field(default_factory=dict)


@dataclass(frozen=True)
class CallSummary:
    """What the step loop learns of one rollout call once it is scored."""

    samples: list[SampleSummary]
    rollout_seconds: float
    reward_seconds: float
    speculated: bool
    policy_version: int
    resumed_tokens: int
    heard_tokens: int = 0
    cap_decisions: CapDecisions = field(default_factory=CapDecisions)
