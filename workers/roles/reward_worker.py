"""A reward worker: scores rollout outputs with the job's verifier or the user's function (in its
own worker processes, reward/pool.py), then tells the step loop a few numbers per response."""

from __future__ import annotations

import os
import time

from rhymerl.api import RLJob
from rhymerl.workers import faults
from rhymerl.workers.model.tokenizer import load_job_tokenizer
from rhymerl.workers.reward.pool import open_scorer
from rhymerl.workers.roles.groups import score_samples
from rhymerl.workers.roles.samples import CallSummary, RolloutOutput, SampleSummary, ScoredSample
from rhymerl.workers.roles.worker_metrics import WorkerMetrics
from rhymerl.workers.task.prompts import load_prompts


class RewardWorker:
    def __init__(self, job: RLJob) -> None:
        self.job = job
        self.tok = load_job_tokenizer(job)
        self.prompts = {p.prompt_id: p for p in load_prompts(job.spec.data)}
        self.scorer = open_scorer(job.spec.reward)
        self.metrics = WorkerMetrics("reward")

    def ping(self) -> int:
        return os.getpid()

    def score(self, output: RolloutOutput, step: int) -> tuple[list[ScoredSample], CallSummary]:
        t0 = time.perf_counter()
        outcomes = score_samples(self.job, self.scorer, self.tok,
                                 [(self.prompts[s.prompt_id], s.index, r)
                                  for s, r in zip(output.samples, output.results, strict=True)], step)
        faults.point("reward-worker", step)
        scored = [ScoredSample(s, r, o.value, o.error, output.policy_version)
                  for s, r, o in zip(output.samples, output.results, outcomes, strict=True)]
        summaries = [SampleSummary(s.sample, len(s.result.response_ids), s.reward, s.error, s.result.drafted,
                                   s.result.accepted, s.result.forward_passes, s.result.by_source) for s in scored]
        seconds = time.perf_counter() - t0
        self.metrics.scored.inc(len(scored))
        self.metrics.call(seconds)
        self.metrics.flush()
        return scored, CallSummary(summaries, output.seconds, seconds, output.speculated, output.policy_version,
                                   output.resumed_tokens, output.heard_tokens, output.cap_decisions)

    def close(self) -> None:
        self.scorer.close()
