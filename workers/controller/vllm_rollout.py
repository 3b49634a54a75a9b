"""The loop's rollout on vLLM (`rollout.engine: vllm`): one vLLM engine over the model folder, the
trainer's weights loaded into it in place whenever the policy version moved, history indexes of
the batch's prompts sent to its HistoSpec proposer before each batch.

The weights vLLM samples with must be the trainer's: `logprob_gap` compares, on the tokens vLLM
generated, the log-probabilities vLLM reported with the trainer's own (both before temperature);
a weight load that failed or loaded the wrong tensors shows up as a gap of whole nats instead of
float rounding (the step's `rollout_logprob_diff_mean` / `_max`, veRL's
`training/rollout_probs_diff_*`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rhymerl.api import RLJob
from rhymerl.workers.controller.history import RunHistory
from rhymerl.workers.controller.prompts import Prompt
from rhymerl.workers.controller.speculation import reachable_batches
from rhymerl.workers.model.folder import model_dir
from rhymerl.workers.model.policy import PolicyModel
from rhymerl.workers.model.tokenizer import Tokenizer
from rhymerl.workers.rollout.engine import GenRequest, GenResult, SamplingParams
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.rollout.verify_cost import Progress
from rhymerl.workers.rollout.vllm_engine import VllmEngine, VllmSettings

if TYPE_CHECKING:
    from rhymerl.workers.controller.loop import Group


@dataclass
class VllmRollout:
    """Generates G responses per prompt on one vLLM engine (same prompts, encodings and sample keys
    as the torch engine's `Rollout`)."""

    job: RLJob
    engine: VllmEngine
    model: PolicyModel
    tok: Tokenizer
    encoded: dict[str, list[int]]
    params: SamplingParams
    history: RunHistory
    synced_version: int = 0
    weight_sync_s: float = 0.0

    @classmethod
    def for_job(cls, job: RLJob, model: PolicyModel, tok: Tokenizer, prompts: list[Prompt],
                history: RunHistory, progress: Progress | None = None) -> VllmRollout:
        """The engine over the job's model folder; with history speculation it first measures its
        pass costs (`progress(done, total)` follows; a few seconds on the embedded model), since
        the draft cap is priced from vLLM's own step times, not the torch engine's."""
        spec, algo = job.spec, job.spec.algorithm
        encoded = {p.prompt_id: tok.prompt_ids(p.text) for p in prompts}
        params = SamplingParams(spec.rollout.temperature, spec.rollout.top_p, spec.rollout.seed,
                                algo.max_response_length)
        engine = cls.engine_for(job, model.vocab_size, max((len(e) for e in encoded.values()), default=1), progress)
        return cls(job, engine, model, tok, encoded, params, history)

    @staticmethod
    def engine_for(job: RLJob, vocab_size: int, longest_prompt: int,
                   progress: Progress | None = None) -> VllmEngine:
        """The job's vLLM engine (also what a Ray rollout worker runs), its pass costs measured
        or taken from this machine's cache when history speculation prices its draft cap."""
        spec = job.spec
        settings = VllmSettings(model=model_dir(spec.model.path), method=spec.rollout.speculation.method,
                                speculation=spec.rollout.speculation, max_batch_size=spec.rollout.max_batch_size,
                                max_model_len=longest_prompt + spec.algorithm.max_response_length,
                                dtype=spec.model.dtype, seed=spec.rollout.seed)
        engine = VllmEngine(settings)
        drafting = spec.rollout.speculation
        if drafting.method == "history" and drafting.disable_above_batch is None:
            engine.cost_profile(reachable_batches(job), vocab_size, progress=progress)
        return engine

    def sync_weights(self, version: int) -> None:
        """Load the trainer's weights into vLLM if they changed since the last load (a resumed run's
        restored weights count as a change: `synced_version` starts at 0, the folder's weights)."""
        self.weight_sync_s = 0.0
        if version != self.synced_version:
            self.weight_sync_s = self.engine.load_weights(self.model.hf_state_dict())
            self.synced_version = version

    def step_stats(self, groups: Sequence[Group]) -> dict[str, Any]:
        """What the step's metrics add for this engine: the rollout/trainer log-probability gap on
        the step's responses (with the weights that generated them) and the last weight load's time."""
        gap = logprob_gap(self.model, [(g.prompt_ids, r) for g in groups for r in g.results])
        out: dict[str, Any] = {"weight_sync_s": round(self.weight_sync_s, 4)}
        if gap is not None:
            out |= {"rollout_logprob_diff_mean": gap[0], "rollout_logprob_diff_max": gap[1]}
        return out

    def keep_cost_evidence(self) -> None:
        """The vLLM pass-cost profile is measured once per machine (VllmEngine.cost_profile); what
        the step's passes showed corrects the proposer's copy online, in the engine."""

    def generate(self, prompts: list[Prompt], epoch: int, batch: object = None) -> list[GenResult]:
        g = self.job.spec.algorithm.group_size
        if self.engine.settings.method == "history":
            indexes = self.history.drafting.indexes_before(epoch, [p.prompt_id for p in prompts])
            self.engine.set_history([self.encoded[p.prompt_id] for p in prompts],
                                    [indexes.get(p.prompt_id) for p in prompts])
        reqs = [GenRequest(self.encoded[p.prompt_id], sample_key(p.prompt_id, epoch, k), p.prompt_id)
                for p in prompts for k in range(g)]
        return self.engine.generate(reqs, self.params, self.tok.stop_ids)

    def close(self) -> None:
        self.engine.close()


@torch.no_grad()
def logprob_gap(model: PolicyModel, samples: Sequence[tuple[list[int], GenResult]]) -> tuple[float, float] | None:
    """Mean and largest |trainer - rollout| log-probability over every response token that carries
    the rollout's log-probability, the trainer's computed before temperature like vLLM's; None when
    no token carries one."""
    diffs = []
    for prompt, result in samples:
        if not result.logprobs or not result.response_ids:
            continue
        tokens = torch.tensor([prompt + result.response_ids])
        logp = torch.log_softmax(model(tokens)[0].double(), dim=-1)
        n = len(prompt)
        picked = logp[n - 1: n - 1 + len(result.response_ids)].gather(
            1, torch.tensor(result.response_ids).unsqueeze(1)).squeeze(1)
        diffs.append((picked - torch.tensor(result.logprobs, dtype=torch.float64)).abs())
    if not diffs:
        return None
    every = torch.cat(diffs)
    return float(every.mean()), float(every.max())
