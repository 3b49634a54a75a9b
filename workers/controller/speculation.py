"""Speculation inside the RL loop: which draft source each rollout uses, and what it achieved.

From the second epoch on, each prompt's rollout drafts from the index of its previous epoch's
responses (method `history`); `ngram` drafts from each sequence's own context. The cost profile
that decides the per-pass cap is measured once per machine and cached (rollout/profile.py); the
passes of every step correct it, and after each step what they showed is kept in the cache and
cells shown measured disturbed are measured again (ProfileStore.update).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rhymerl.algorithms.drafting.adaptive_cap import CostEvidence
from rhymerl.api import RLJob
from rhymerl.workers import dumps
from rhymerl.workers.history.store import MemoryHistoryStore
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout.engine import DraftSource
from rhymerl.workers.rollout.profile import BATCHES, ProfileStore, Progress
from rhymerl.workers.rollout.speculators import HistoryDrafts, NgramDrafts, SpecController

if TYPE_CHECKING:
    from rhymerl.workers.controller.loop import Group


def reachable_batches(job: RLJob) -> tuple[int, ...]:
    """The profile's batch sizes: those this job can reach (a batch never runs more sequences)."""
    busiest = min(job.spec.rollout.max_batch_size, job.spec.algorithm.prompts_per_step * job.spec.algorithm.group_size)
    return (*(b for b in BATCHES if b < busiest), busiest)


@dataclass
class Speculation:
    method: str
    control: SpecController
    store: MemoryHistoryStore
    costs: ProfileStore | None = None

    @classmethod
    def for_job(cls, job: RLJob, model: TinyLlama, resume_from: Path | None = None,
                progress: Progress | None = None) -> Speculation:
        """`progress(done, total)` follows the cost profile's measurement (profile.Progress)."""
        spec = job.spec.rollout.speculation
        if spec.method == "draft-model":
            raise ValueError("spec.rollout.speculation.method: draft-model needs the vllm engine; "
                             "the torch engine supports none, history and ngram")
        costs = evidence = None
        if spec.method != "none" and spec.disable_above_batch is None:
            costs = ProfileStore.open(model, batches=reachable_batches(job), progress=progress)
            evidence = CostEvidence(costs.profile)
        control = SpecController(spec, evidence.profile if evidence else None, evidence=evidence)
        out = cls(spec.method, control, MemoryHistoryStore(spec.reward_weighted), costs)
        if resume_from is not None and spec.method == "history" and (resume_from / dumps.DUMP_DIR).is_dir():
            out.store.update(r for path in dumps.step_files(resume_from) for r in dumps.read_file(path))
        return out

    def drafts(self, epoch: int, prompt_ids: Sequence[str]) -> DraftSource | None:
        spec = self.control.spec
        if self.method == "history":
            indexes = self.store.indexes_before(epoch, prompt_ids)
            return HistoryDrafts(spec, indexes, self.control) if indexes else None
        if self.method == "ngram":
            return NgramDrafts(spec, self.control)
        return None

    def replica_drafts(self, epoch: int, prompt_ids: Sequence[str], replicas: int) -> list[DraftSource | None]:
        """One draft source per rollout replica (each keeps per-slot state), every one able to draft
        for every prompt of the batch, since the scheduler may move any sample anywhere; history
        indexes are built once and shared (they are immutable)."""
        spec = self.control.spec
        if self.method == "history":
            indexes = self.store.indexes_before(epoch, prompt_ids)
            return [HistoryDrafts(spec, indexes, self.control) if indexes else None for _ in range(replicas)]
        return [self.drafts(epoch, prompt_ids) for _ in range(replicas)]

    def remember(self, records: Iterable[dumps.RolloutRecord]) -> None:
        """After a step: its responses become history, and what its passes showed about the cost
        profile is cached (cells shown measured disturbed are measured again)."""
        if self.method == "history":
            self.store.update(records)
        if self.costs is not None and self.control.evidence is not None:
            self.costs.update(self.control.evidence)

    def metrics(self, groups: list[Group]) -> dict[str, Any]:
        results = [r for g in groups for r in g.results]
        tokens = sum(len(r.response_ids) for r in results)
        drafted = sum(r.drafted for r in results)
        accepted = sum(r.accepted for r in results)
        passes = sum(r.forward_passes for r in results)
        return {
            "spec_rate": round(accepted / max(tokens, 1), 4),
            "spec_acceptance": round(accepted / drafted, 4) if drafted else None,
            "tokens_per_pass": round(tokens / max(passes, 1), 3),
        }
