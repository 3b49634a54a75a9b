"""What the step loop may ask of each role worker, as typed Protocols: the transport takes a method
of these (`RolloutAPI.generate`), never a name, so mypy checks every remote call's method, arguments
and result, and a worker class that stops matching its API fails where the step loop starts it
(loop.py). Also which methods run beside a worker's ordered calls (its concurrency groups), so the
seam names no concrete worker class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.workers import dumps
from rhymerl.workers.roles.groups import StepLayout
from rhymerl.workers.roles.samples import (
    CallSummary,
    GroupKey,
    RolloutCall,
    RolloutOutput,
    RolloutProgress,
    SampleRef,
    ScoredSample,
    Tag,
)
from rhymerl.workers.roles.weight_layout import Group, Layout
from rhymerl.workers.rollout.draft_link import DraftLink, DraftStream, News
from rhymerl.workers.rollout.generation import GenRequest
from rhymerl.workers.rollout.group_drafts import GrownTokens
from rhymerl.workers.run_folder.in_flight import InFlight
from rhymerl.workers.run_folder.loop_state import LoopState

if TYPE_CHECKING:
    import torch

Weights = dict[str, "torch.Tensor"]
"""A policy version's tensors under Hugging Face names, on the CPU."""


class WeightsRef(Protocol):
    """Weights held elsewhere, resolved only if the receiver needs them (Transport.deferred)."""

    def get(self) -> Weights: ...


RolloutItem = Tag | RolloutProgress | RolloutOutput | None
"""What a rollout call yields: an item, then its tag (roles/samples.py Tag)."""


class RolloutAPI(Protocol):
    """A rollout worker (roles/rollout_worker.py RolloutWorker)."""

    def ping(self) -> tuple[int, bool]: ...
    def host(self) -> str: ...
    def cost_profile(self) -> CostProfile | None: ...
    def receive_weights(self, version: int, group: Group, rank: int, layout: Layout) -> None: ...
    def load_weights(self, version: int, weights: Weights | WeightsRef) -> tuple[float, bool]: ...
    def generate(self, call: RolloutCall, indexes: Mapping[str, HistoryIndex] | None,
                 resume: RolloutProgress | None = None) -> Iterator[RolloutItem]: ...
    def release(self, call: int, samples: Sequence[SampleRef]) -> None: ...
    def admit(self, call: int, samples: list[SampleRef], requests: list[GenRequest],
              partials: RolloutProgress | None) -> bool: ...
    def leave(self) -> None: ...
    def draft_from(self, call: int, link: DraftLink | None) -> None: ...
    def hear(self, call: int, blocks: list[GrownTokens]) -> None: ...
    def exchange(self, link: object, news: list[News]) -> list[DraftStream]: ...
    def drop_link(self, link: object) -> None: ...
    def end_step(self) -> None: ...


class TrainAPI(Protocol):
    """One train rank (roles/train_worker.py TrainWorker); `join`, `restore`, `step`, `save` are
    collective (controller/train_role.py), the others rank 0's."""

    def ping(self) -> int: ...
    def listen(self) -> tuple[str, int]: ...
    def join(self, host: str, port: int) -> None: ...
    def restore(self, recorded: int) -> tuple[LoopState, InFlight] | None: ...
    def restored_weights(self, version: int) -> Weights: ...
    def history_records(self) -> list[dumps.RolloutRecord]: ...
    def lengths(self) -> list[tuple[str, list[int]]]: ...
    def weights(self, version: int | None = None) -> Weights: ...
    def weight_channel(self) -> tuple[str, int, Layout]: ...
    def send_weights(self, version: int, group: Group) -> float: ...
    def step(self, state: LoopState, layout: StepLayout, kept: list[GroupKey],
             *scored: list[ScoredSample]) -> tuple[dict[str, float], Weights | None]: ...
    def save(self, state: LoopState, in_flight: InFlight = ..., *policies: Weights) -> str | None: ...


class RewardAPI(Protocol):
    """A reward worker (roles/reward_worker.py RewardWorker)."""

    def ping(self) -> int: ...
    def score(self, output: RolloutOutput, step: int) -> tuple[list[ScoredSample], CallSummary]: ...
    def close(self) -> None: ...


class HistoryAPI(Protocol):
    """The history worker (roles/history_worker.py HistoryWorker)."""

    def ping(self) -> int: ...
    def refill(self, dumped: list[dumps.RolloutRecord]) -> int: ...
    def indexes(self, epoch: int, prompt_ids: list[str], step: int) -> tuple[dict[str, HistoryIndex], int]: ...
    def record(self, state: LoopState, layout: StepLayout, *scored: list[ScoredSample]) -> int: ...
    def close(self) -> None: ...


_GROUPS: dict[str, tuple[Callable[..., object], ...]] = {
    "control": (RolloutAPI.release, RolloutAPI.admit, RolloutAPI.leave, RolloutAPI.host, RolloutAPI.draft_from,
                RolloutAPI.hear),
    "weights": (RolloutAPI.receive_weights, TrainAPI.weight_channel, TrainAPI.send_weights),
    "drafts": (RolloutAPI.exchange, RolloutAPI.drop_link),
}
"""Methods that run beside the worker's ordered calls, by concurrency group: `control` reaches a running
rollout call, `weights` receives or sends a broadcast beside it, `drafts` drafts for another worker's call
(each worker class declares the groups' sizes in its CONCURRENCY_GROUPS)."""
_GROUP_OF = {m.__qualname__: group for group, methods in _GROUPS.items() for m in methods}


def concurrency_group(method: Callable[..., object]) -> str | None:
    """The concurrency group `method` (an API's) runs in; None: in order with the worker's other calls."""
    return _GROUP_OF.get(method.__qualname__)


def group_methods(group: str) -> frozenset[str]:
    """The names of the methods of a concurrency group (what a worker class's own sets must say)."""
    return frozenset(m.__name__ for m in _GROUPS[group])
