"""The seam between a rollout worker and the engine that runs its calls (torch_rollout.py,
vllm_rollout.py): what an engine can do, declared as a record the fleet can read from the spec
without starting one, and what the worker asks of it.

The worker owns what every engine shares (the weights' version, the metrics, the call's clock,
the control mailbox); an engine owns its model and how a call goes through it.
"""

from __future__ import annotations

from collections.abc import Collection, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeAlias

import torch

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api import RLJobSpec
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.roles.busy_clock import BusyClock
from rhymerl.workers.roles.call_mailbox import CallMailbox
from rhymerl.workers.roles.samples import (
    CallState,
    Handback,
    HandbackTag,
    RolloutCall,
    RolloutOutput,
    RolloutProgress,
    SampleRef,
    Tag,
)
from rhymerl.workers.rollout.generation import GenResult

Weights = dict[str, torch.Tensor]
Report: TypeAlias = Tag | RolloutProgress | RolloutOutput | None
"""What a call yields: each item, then its tag (module samples.Tag)."""


@dataclass(frozen=True)
class EngineAbilities:
    """What an engine's running call can do besides generating."""

    releases: bool
    """Hands named samples (`release`) or every unfinished one (`leave`) back mid-call, with their tokens."""
    admits: bool
    """Takes moved samples, with their tokens, into its running call (`admit`)."""
    snapshots: bool
    """Reports its samples' tokens every `snapshot_every` passes: a lost call resumes from them."""
    remote_drafts: bool
    """Verifies drafts from a freed drafter (`draft_from`) and drafts for another worker's call (`exchange`)."""
    relays_groups: bool
    """Shares its samples' new tokens (`share_every`) and hears their siblings' from other workers (`hear`)."""


TORCH = EngineAbilities(releases=True, admits=True, snapshots=True, remote_drafts=True, relays_groups=True)
VLLM = EngineAbilities(releases=True, admits=False, snapshots=False, remote_drafts=True, relays_groups=False)
"""vLLM's sampling is not keyed by position: a lost call is run again whole, and a sample cannot
join a running generate; its group drafts are its own. Our proposer inside it verifies a freed
drafter's drafts (rollout/vllm_proposer.py), and a vLLM worker drafts for others with the job's
draft model beside its engine."""


def engine_abilities(spec: RLJobSpec) -> EngineAbilities:
    """The abilities of the engine `spec` runs its rollouts on."""
    return VLLM if spec.rollout.engine == "vllm" else TORCH


@dataclass(frozen=True)
class CallEnd:
    """What a call's engine leaves the worker: the samples it kept (not handed back) and their results."""

    samples: list[SampleRef]
    results: list[GenResult]
    resumed_tokens: int  # tokens the kept samples brought from elsewhere
    heard_tokens: int  # siblings' tokens from other workers its group indexes took in
    state: CallState  # the call's last report


class RolloutEngine(Protocol):
    abilities: ClassVar[EngineAbilities]

    def run(self, call: RolloutCall, indexes: Mapping[str, HistoryIndex] | None, resume: RolloutProgress | None,
            mailbox: CallMailbox, busy: BusyClock) -> Generator[Report, None, CallEnd]:
        """The call's reports up to its output (the worker's); between passes it honours what
        `mailbox` collected, and `busy` stands still while it waits at a yield."""
        ...

    def load_weights(self, weights: Weights) -> None: ...

    def drafter(self) -> TinyLlama | None:
        """The model it drafts for other workers' calls with (None: it drafts for none)."""
        ...

    def cost_profile(self) -> CostProfile | None: ...

    def end_step(self) -> None: ...

    def close(self) -> None: ...


def is_finished(r: GenResult, stop_ids: Collection[int], max_len: int) -> bool:
    """Whether `r` ended: at an end token or at the length limit."""
    ids = r.response_ids
    return bool(ids) and (ids[-1] in stop_ids or len(ids) >= max_len)


def sample_order(s: SampleRef) -> tuple[int, str, int]:
    return s.epoch, s.prompt_id, s.index


def reported(busy: BusyClock, item: RolloutProgress | None, tag: Tag) -> Iterator[Report]:
    """An item and its tag, `busy` standing still while the caller reads them."""
    busy.pause()
    yield item
    yield tag
    busy.resume()


def handed_back(busy: BusyClock, taken: dict[SampleRef, GenResult], release: set[SampleRef],
                leaving: bool) -> Iterator[Report]:
    """The samples taken out of a call, with their tokens, then the handback naming them and the
    released ones it no longer held (finished, or never there)."""
    handed = {s: len(r.response_ids) for s, r in taken.items()}
    busy.pause()
    yield RolloutProgress(taken)
    yield HandbackTag(Handback(handed, sorted(release - handed.keys(), key=sample_order), leaving))
    busy.resume()
