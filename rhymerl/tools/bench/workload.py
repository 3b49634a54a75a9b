"""The workload the engine benchmarks replay: a finished run's next epoch, as its rollout would see it.

Why one loader: `bench rollout` (speculation) and `bench replicas` (scheduling) must time the
same requests (the run's prompt order, sample keys of the next epoch), the same weights (the
newest checkpoint) and the same history (the run's dumps), so their numbers can be read together.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rhymerl.api.spec import RLJob
from rhymerl.workers import dumps
from rhymerl.workers.history.store import MemoryHistoryStore
from rhymerl.workers.model.policy import PolicyModel, read_weights
from rhymerl.workers.model.registry import load_policy
from rhymerl.workers.model.tokenizer import Tokenizer
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout.engine import GenRequest, SamplingParams
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.run_folder.run_dir import RunDir, RunDirError
from rhymerl.workers.task.prompts import epoch_order, load_prompts


@dataclass
class RunWorkload:
    job: RLJob
    model: PolicyModel
    tokenizer: Tokenizer
    checkpoint: str
    records: list[dumps.RolloutRecord]
    """Every response the run dumped, in step order."""
    epoch: int
    """The epoch generated: one past the run's last."""
    prompt_ids: list[str]
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
        return self.epoch - 1

    @property
    def per_step(self) -> int:
        return self.job.spec.algorithm.prompts_per_step * self.job.spec.algorithm.group_size

    def history(self, reward_weighted: bool | None = None) -> MemoryHistoryStore:
        """The drafting store the run's history worker held when its last epoch ended: each prompt's
        index of its last `history_epochs` epochs (`reward_weighted` None: the job's)."""
        spec = self.job.spec.rollout.speculation
        store = MemoryHistoryStore(spec.reward_weighted if reward_weighted is None else reward_weighted,
                                   spec.history_epochs)
        store.update(self.records)
        return store

    def steps(self) -> list[list[GenRequest]]:
        """The requests cut into training steps, as `rhymerl run` generates them."""
        return [self.requests[i: i + self.per_step] for i in range(0, len(self.requests), self.per_step)]


def load_run_workload(path: Path) -> RunWorkload:
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
    epoch = max(r.epoch for r in records) + 1
    prompts = load_prompts(job.spec.data)
    g = job.spec.algorithm.group_size
    order = epoch_order(len(prompts), job.spec.data.seed, epoch, job.spec.data.shuffle)
    reqs = [GenRequest(tok.prompt_ids(prompts[i].text), sample_key(prompts[i].prompt_id, epoch, k),
                       prompts[i].prompt_id) for i in order for k in range(g)]
    r = job.spec.rollout
    params = SamplingParams(r.temperature, r.top_p, r.seed, job.spec.algorithm.max_response_length)
    return RunWorkload(job, model, tok, ckpts[-1].name, records, epoch, [p.prompt_id for p in prompts], reqs, params)
