"""The train worker: the policy's master weights and optimiser. It trains on a step's kept groups,
writes the step's rollout dump (the replay buffer's record) and the checkpoints, and hands the new
weights to the rollout fleet."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from rhymerl.api import RLJob
from rhymerl.workers import dumps, faults
from rhymerl.workers.model.registry import load_policy
from rhymerl.workers.roles.groups import StepLayout, records, training_samples
from rhymerl.workers.roles.rollout_worker import Weights, encode_prompts
from rhymerl.workers.roles.samples import GroupKey, ScoredSample
from rhymerl.workers.roles.worker_metrics import WorkerMetrics
from rhymerl.workers.run_folder.run_dir import LoopState, RunDir, pod_run_dir
from rhymerl.workers.task.prompts import load_prompts
from rhymerl.workers.train.logprob_gap import logprob_gap
from rhymerl.workers.train.trainer import Trainer

OPEN_GROUPS = "open_groups"  # a checkpoint's record of groups it left open


class TrainWorker:
    def __init__(self, job: RLJob, run: RunDir | str | None, threads: int | None = None) -> None:
        """run: the run folder (the step loop's own in its process, or its path on this machine);
        None on a pod: the run folder on the pod's own data volume. threads: torch's intra-op
        threads (None: leave the process's setting)."""
        if threads is not None:
            torch.set_num_threads(threads)
        torch.manual_seed(job.spec.rollout.seed)
        spec = job.spec
        self.job = job
        self.run = run if isinstance(run, RunDir) else RunDir(Path(run) if run else pod_run_dir())
        self.run.path.mkdir(parents=True, exist_ok=True)
        self.model, tok = load_policy(spec.model)
        self.trainer = Trainer(self.model, spec.algorithm, spec.rollout.temperature)
        self.prompts = {p.prompt_id: p for p in load_prompts(spec.data)}
        self.encoded = encode_prompts(tok, list(self.prompts.values()))
        self.metrics = WorkerMetrics("train")

    def ping(self) -> int:
        return os.getpid()

    def restore(self) -> tuple[LoopState, list[GroupKey]]:
        """Weights and optimiser of the newest intact checkpoint; metrics and dumps cut back to it.
        Also the groups that checkpoint left open (an outlier of theirs was deferred past it): the
        resumed run generates them again, whole."""
        state = self.run.restore(self.model, self.trainer.optimizer)
        return state, [(int(e), str(p)) for e, p in self.run.checkpoint_extra(state.step).get(OPEN_GROUPS, [])]

    def history_records(self) -> list[dumps.RolloutRecord]:
        """Every dumped response (what a history worker starting mid-run refills its store from)."""
        return dumps.read_run(self.run.path) if (self.run.path / dumps.DUMP_DIR).is_dir() else []

    def lengths(self) -> list[tuple[str, list[int]]]:
        """Each dumped group's response lengths, in step order (the step loop's length history)."""
        groups: dict[tuple[int, str], list[int]] = {}
        for rec in self.history_records():
            groups.setdefault((rec.step, rec.prompt_id), []).append(len(rec.response_ids))
        return [(pid, ls) for (_, pid), ls in groups.items()]

    def weights(self) -> Weights:
        """Copies under Hugging Face names; a tied output layer is the embedding's copy, not a second one."""
        copies: dict[int, torch.Tensor] = {}
        return {k: copies.setdefault(v.data_ptr(), v.detach().clone()) for k, v in self.model.hf_state_dict().items()}

    def step(self, state: LoopState, layout: StepLayout, kept: list[GroupKey],
             *scored: list[ScoredSample]) -> tuple[dict[str, float], Weights | None]:
        """Train on the kept groups of the step, then dump every group. `state` is the loop's state
        after the step. Returns the statistics and, if the weights changed, the new weights."""
        groups = layout.assemble(scored, self.prompts, self.encoded, self.job.spec.algorithm.group_size)
        wanted = set(kept)
        samples = training_samples([grp for grp in groups if (grp.epoch, grp.prompt.prompt_id) in wanted], self.job,
                                   state.step)
        # the rollout engine's log-probabilities against these weights, on the samples they generated
        current = state.policy_version - (1 if samples else 0)
        gap = logprob_gap(self.model, [(grp.prompt_ids, r) for grp in groups if grp.policy_version == current
                                       for r in grp.results])
        t0 = time.perf_counter()
        stats = self.trainer.step(samples) if samples else {}
        stats["time_train_s"] = time.perf_counter() - t0
        if gap is not None:
            stats["rollout_logprob_diff_mean"], stats["rollout_logprob_diff_max"] = gap
        if samples and (self.trainer.skipped_samples or self.trainer.skipped_updates):
            self.run.note(f"step {state.step}: on_nonfinite=skip left out {len(self.trainer.skipped_samples)} "
                          f"sample(s) {self.trainer.skipped_samples} and {self.trainer.skipped_updates} update(s) "
                          "with a nan/inf value")
        dumps.write_step(self.run.path, state.step, list(records(groups, state)))
        faults.point("dump", state.step)
        self.metrics.call(stats["time_train_s"])
        self.metrics.flush()
        return stats, (self.weights() if samples else None)

    def save(self, state: LoopState, open_groups: Sequence[GroupKey] = ()) -> str:
        return str(self.run.save_checkpoint(state, self.model, self.trainer.optimizer,
                                            self.job.spec.checkpoint.keep_last,
                                            {OPEN_GROUPS: [list(k) for k in open_groups]}))
