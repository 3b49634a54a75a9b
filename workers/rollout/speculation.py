"""Speculation inside the RL loop: which draft source each rollout uses, and what it achieved.

From the second epoch on, each prompt's rollout drafts from the index of its previous epoch's
responses (method `history`), and in every epoch from its group's responses of the current step as
they are generated (`group_drafts`); `ngram` drafts from each sequence's own context, `draft-model`
from a small model of the policy's tokenizer (draft_model.py). The cost profile
that decides the per-pass cap is measured once per machine and cached (rollout/verify_cost.py); the
passes of every step correct it, and after each step what they showed is kept in the cache and
cells shown measured disturbed are measured again (ProfileStore.update).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rhymerl.algorithms.drafting.adaptive_cap import CostEvidence
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api import RLJob
from rhymerl.workers.history.store import HistoryStore
from rhymerl.workers.model.folder import model_dir
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout.draft_model import DraftModelDrafts, load_draft_model
from rhymerl.workers.rollout.engine import DraftSource
from rhymerl.workers.rollout.fastest_of_n import job_sources
from rhymerl.workers.rollout.generation import SourceCount
from rhymerl.workers.rollout.group_drafts import GroupDrafts
from rhymerl.workers.rollout.speculators import DraftCapController, HistoryDrafts, NgramDrafts
from rhymerl.workers.rollout.verify_cost import BATCHES, ProfileStore, Progress


def reachable_batches(job: RLJob) -> tuple[int, ...]:
    """The profile's batch sizes: those this job can reach (a batch never runs more sequences)."""
    busiest = min(job.spec.rollout.max_batch_size, job.spec.algorithm.prompts_per_step * job.spec.algorithm.group_size)
    return (*(b for b in BATCHES if b < busiest), busiest)


@dataclass
class RolloutSpeculation:
    """The job's speculation method for its rollouts: a draft source per rollout, the controller of
    the per-pass draft cap, and the cached verify-cost profile behind it."""

    method: str
    control: DraftCapController
    drafting: HistoryStore
    costs: ProfileStore | None = None
    draft: TinyLlama | None = None
    """method draft-model, and fastest-of-n or freed_drafters with draft_model set: the draft model
    (draft_model.DraftModelDrafts; a freed worker drafts with it for others, rollout/remote_drafts.py)."""

    @classmethod
    def for_job(cls, job: RLJob, model: TinyLlama, drafting: HistoryStore,
                progress: Progress | None = None) -> RolloutSpeculation:
        """`drafting` holds the responses history drafting reads (RunHistory.drafting);
        `progress(done, total)` follows the cost profile's measurement (verify_cost.Progress)."""
        spec = job.spec.rollout.speculation
        draft = None
        if (spec.method in ("draft-model", "fastest-of-n") or spec.freed_drafters) and spec.draft_model is not None:
            param = next(model.parameters())
            draft = load_draft_model(spec.draft_model, model_dir(job.spec.model.path), param.dtype, param.device)
        costs = evidence = None
        if spec.method != "none" and spec.disable_above_batch is None:
            costs = ProfileStore.open(model, batches=reachable_batches(job), progress=progress)
            evidence = CostEvidence(costs.profile)
        control = DraftCapController(spec, evidence.profile if evidence else None, evidence=evidence)
        return cls(spec.method, control, drafting, costs, draft)

    def drafts(self, epoch: int, prompt_ids: Sequence[str]) -> DraftSource | None:
        indexes = self.drafting.indexes_before(epoch, prompt_ids) if self.control.spec.reads_history else {}
        return self.drafts_from(indexes)

    def drafts_from(self, indexes: Mapping[str, HistoryIndex], groups: GroupDrafts | None = None) -> DraftSource | None:
        """The draft source of one rollout, given the indexes of its prompts that history has (a
        rollout worker receives them from a history worker) and, with `group_drafts`, the call's
        group indexes (None: the source's own; siblings on other workers join a worker's)."""
        spec = self.control.spec
        if self.method == "history":
            return HistoryDrafts(spec, indexes, self.control, groups) if indexes or spec.group_drafts else None
        if self.method == "ngram":
            return NgramDrafts(spec, self.control)
        if self.method == "draft-model" and self.draft is not None:
            return DraftModelDrafts(spec, self.draft, self.control)
        if self.method == "fastest-of-n":
            return job_sources(spec, indexes, self.control, self.draft, groups)
        return None

    def keep_cost_evidence(self) -> None:
        """After a step: what its passes showed about the cost profile goes into the cache (cells
        shown measured disturbed are measured again)."""
        if self.costs is not None and self.control.evidence is not None:
            self.costs.update(self.control.evidence)


def speculation_metrics(tokens: int, drafted: int, accepted: int, passes: int,
                        by_source: Mapping[str, SourceCount] | None = None) -> dict[str, Any]:
    """Speculation rate (accepted draft tokens per response token), acceptance rate, tokens per
    pass, from the step's totals; with `by_source`, per draft source its share of the drafting
    passes and its acceptance rate (`spec_sources`)."""
    out: dict[str, Any] = {
        "spec_rate": round(accepted / max(tokens, 1), 4),
        "spec_acceptance": round(accepted / drafted, 4) if drafted else None,
        "tokens_per_pass": round(tokens / max(passes, 1), 3),
    }
    drafting = sum(c.passes for c in (by_source or {}).values())
    if by_source and drafting:
        out["spec_sources"] = {name: {"share": round(c.passes / drafting, 4),
                                      "acceptance": round(c.accepted / c.drafted, 4) if c.drafted else None}
                               for name, c in sorted(by_source.items())}
    return out
