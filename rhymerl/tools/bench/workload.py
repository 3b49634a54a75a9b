"""The workload the engine benchmarks replay: an epoch of a finished run (by default the next one), as
its rollout would see it.

Why one loader: `bench rollout` (speculation) and `bench replicas` (scheduling) must time the
same requests (the run's prompt order, sample keys of the next epoch), the same weights (the
newest checkpoint) and the same history (the run's dumps), so their numbers can be read together.
An earlier epoch replays on the same weights with the history the job held before it (epoch 1: none
of a prompt's own), step by step (EpochDrafting).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api.spec import RLJob
from rhymerl.errors import UserError
from rhymerl.workers import dumps
from rhymerl.workers.history.run_history import RunHistory
from rhymerl.workers.history.store import MemoryHistoryStore
from rhymerl.workers.model.policy import PolicyModel, read_weights
from rhymerl.workers.model.registry import load_policy
from rhymerl.workers.model.tokenizer import Tokenizer
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.reward.pool import Scorer
from rhymerl.workers.roles.groups import Group, score_samples
from rhymerl.workers.roles.groups import records as rollout_records
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.run_folder.loop_state import LoopState
from rhymerl.workers.run_folder.run_dir import RunDir, RunDirError
from rhymerl.workers.task.prompts import Prompt, epoch_order, load_prompts, prompt_tokens


@dataclass
class RunWorkload:
    job: RLJob
    model: PolicyModel
    tokenizer: Tokenizer
    checkpoint: str
    records: list[dumps.RolloutRecord]
    """Every response the run dumped, in step order."""
    epoch: int
    """The epoch generated: one past the run's last unless asked for an earlier one."""
    prompt_ids: list[str]
    prompts: dict[str, Prompt]
    requests: list[GenRequest]
    """That epoch's samples in the run's prompt order, group_size per prompt."""
    params: SamplingParams

    @property
    def native(self) -> TinyLlama:
        """The policy as the torch engine needs it: rhymerl's native model."""
        if not isinstance(self.model, TinyLlama):
            raise RunDirError(f"{self.job.metadata.name}: the torch engine decodes the native model only; this "
                              "run's model.implementation is transformers (use --engine vllm)")
        return self.model

    @property
    def last_epoch(self) -> int:
        """The newest epoch drafted from."""
        return self.epoch - 1

    @property
    def earlier(self) -> list[dumps.RolloutRecord]:
        """The run's responses of the epochs before the one generated."""
        return [r for r in self.records if r.epoch < self.epoch]

    @property
    def per_step(self) -> int:
        return self.job.spec.algorithm.prompts_per_step * self.job.spec.algorithm.group_size

    def history(self, reward_weighted: bool | None = None) -> MemoryHistoryStore:
        """The drafting store the run's history worker held when its last epoch ended: each prompt's
        index of its last `history_epochs` epochs (`reward_weighted` None: the job's)."""
        spec = self.job.spec.rollout.speculation
        store = MemoryHistoryStore(spec.reward_weighted if reward_weighted is None else reward_weighted,
                                   spec.history_epochs)
        store.update(self.earlier)
        return store

    def drafting(self, scorer: Scorer, reward_weighted: bool | None = None) -> EpochDrafting:
        """What each training step of the generated epoch drafts from (see EpochDrafting); `scorer`
        rewards the epoch's own responses as the job's reward would."""
        return EpochDrafting(self, self._run_history(reward_weighted), scorer)

    def drafting_at_start(self, reward_weighted: bool | None = None) -> dict[str, HistoryIndex]:
        """What every prompt drafts from as the generated epoch begins (the workloads that decode the
        whole epoch as one pool)."""
        return self._run_history(reward_weighted).indexes(self.epoch, self.prompt_ids)

    def _run_history(self, reward_weighted: bool | None) -> RunHistory:
        spec = self.job.spec.rollout.speculation
        if reward_weighted is not None:
            spec = spec.model_copy(update={"reward_weighted": reward_weighted})
        history = RunHistory.in_memory(spec)
        history.record(self.earlier)
        return history

    def steps(self) -> list[list[GenRequest]]:
        """The requests cut into training steps, as `rhymerl run` generates them."""
        return [self.requests[i: i + self.per_step] for i in range(0, len(self.requests), self.per_step)]


class EpochDrafting:
    """What each training step of the generated epoch drafts from, as the job's history holds it
    when that step's rollout begins: each prompt's own earlier epochs from the run's dumps, else the
    recent responses (`speculation.recent_tokens`), which include the epoch's earlier steps as this
    replay generates them (their tokens, scored by the job's reward), so epoch 1 drafts as a job's
    first epoch does. That is the local backend's order (a step recorded before the next one's
    rollout; at max_off_policy_steps 1 on Ray a rollout begins one step earlier). The first method
    to finish a step records it for all, so every method drafts from the same state (the torch
    engine's methods generate the same tokens; vLLM's the same distribution)."""

    def __init__(self, w: RunWorkload, history: RunHistory, scorer: Scorer) -> None:
        self.w = w
        self.history = history
        self.scorer = scorer
        self.steps = w.steps()
        self._before: list[dict[str, HistoryIndex]] = []
        self._recorded = 0

    def before(self, step: int) -> dict[str, HistoryIndex]:
        """Step `step`'s indexes (0-based within the epoch), once every earlier step is recorded."""
        if step > self._recorded:
            raise RuntimeError(f"step {step}: step {self._recorded} of the epoch has not been generated")
        if step == len(self._before):
            chunk = self.steps[step]
            self._before.append(self.history.indexes(self.w.epoch, dict.fromkeys(r.prompt_id for r in chunk)))
        return self._before[step]

    def generated(self, step: int, results: Sequence[GenResult]) -> None:
        """Step `step` was generated: its responses are recorded the first time, not again."""
        if step < self._recorded:
            return
        if step > self._recorded:
            raise RuntimeError(f"step {step}: step {self._recorded} of the epoch has not been generated")
        w, g = self.w, self.w.job.spec.algorithm.group_size
        chunk = self.steps[step]
        samples = [(w.prompts[req.prompt_id], i % g, res)
                   for i, (req, res) in enumerate(zip(chunk, results, strict=True))]
        outcomes = score_samples(w.job, self.scorer, w.tokenizer, samples, step + 1)
        groups = [Group(samples[j][0], chunk[j].prompt_ids, list(results[j: j + g]),
                        [o.value for o in outcomes[j: j + g]], [o.error for o in outcomes[j: j + g]],
                        0, w.epoch) for j in range(0, len(chunk), g)]
        self.history.record(rollout_records(groups, LoopState(step=step + 1, epoch=w.epoch)))
        self._recorded += 1


def load_run_workload(path: Path, epoch: int | None = None) -> RunWorkload:
    """epoch: the epoch to generate, 1 to one past the run's last (None: one past)."""
    run = RunDir(path)
    job = run.load_job()
    ckpts = run.checkpoint_dirs()
    if not ckpts:
        raise RunDirError(f"{path}: no checkpoint to take the policy from")
    model, tok = load_policy(job.spec.model)
    model.load_hf_state_dict(read_weights(ckpts[-1]))
    model.eval()
    records = dumps.read_run(path)
    if not records:
        raise dumps.DumpError(f"{path}: no rollout dumps to take history from")
    following = max(r.epoch for r in records) + 1
    if epoch is None:
        epoch = following
    elif not 1 <= epoch <= following:
        raise UserError(f"--epoch {epoch}: {path} ran epochs 1-{following - 1}; generate one of 1-{following}")
    prompts = load_prompts(job.spec.data)
    g = job.spec.algorithm.group_size
    order = epoch_order(len(prompts), job.spec.data.seed, epoch, job.spec.data.shuffle)
    reqs = [GenRequest(prompt_tokens(tok, prompts[i]), sample_key(prompts[i].prompt_id, epoch, k),
                       prompts[i].prompt_id) for i in order for k in range(g)]
    r = job.spec.rollout
    params = SamplingParams(r.temperature, r.top_p, r.seed, job.spec.algorithm.max_response_length)
    return RunWorkload(job, model, tok, ckpts[-1].name, records, epoch, [p.prompt_id for p in prompts],
                       {p.prompt_id: p for p in prompts}, reqs, params)
