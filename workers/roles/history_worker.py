"""The history worker: the job's drafting history (memory, or Redis shared by every history
worker). It records each step's groups and builds the indexes a rollout worker drafts from."""

from __future__ import annotations

import os
import time

from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api import RLJob
from rhymerl.workers import dumps, faults
from rhymerl.workers.history.run_history import RunHistory, new_run_id
from rhymerl.workers.model.tokenizer import load_job_tokenizer
from rhymerl.workers.roles.groups import StepLayout, records
from rhymerl.workers.roles.samples import ScoredSample
from rhymerl.workers.roles.worker_metrics import WorkerMetrics
from rhymerl.workers.run_folder.loop_state import LoopState
from rhymerl.workers.task.prompts import encode_prompts, load_prompts


class HistoryWorker:
    def __init__(self, job: RLJob, run_id: str | None = None) -> None:
        """Starts empty: the step loop refills it (`refill`) before its first index. `run_id` names the
        run's keys in Redis (run_history.history_run_id; a fresh one without)."""
        self.job = job
        self.closed = False
        self.history = RunHistory.for_job(job, run_id or new_run_id())
        self.prompts = {p.prompt_id: p for p in load_prompts(job.spec.data)}
        self.encoded = encode_prompts(load_job_tokenizer(job), list(self.prompts.values()))
        self.metrics = WorkerMetrics("history")

    def refill(self, dumped: list[dumps.RolloutRecord]) -> int:
        """Record every response dumped so far (the train worker keeps the dumps), so a history worker
        started by a resumed run, or started again, drafts what the first one would have."""
        self.history.record(dumped)
        return len(dumped)

    def ping(self) -> int:
        return os.getpid()

    def indexes(self, epoch: int, prompt_ids: list[str], step: int) -> tuple[dict[str, HistoryIndex], int]:
        """The indexes (for a rollout worker) and how many there are (for the step loop, which learns
        from this small second object whether the call served without fetching the indexes)."""
        faults.point("history-worker", step)
        t0 = time.perf_counter()
        found = self.history.indexes(epoch, prompt_ids)
        distinct = {id(i): i for i in found.values()}.values()  # the recent index goes once for many prompts
        self.metrics.shipped.inc(len(distinct))
        self.metrics.shipped_bytes.inc(sum(i.stats().serialized_bytes for i in distinct))
        self.metrics.call(time.perf_counter() - t0)
        self.metrics.flush()
        return found, len(found)

    def record(self, state: LoopState, layout: StepLayout, *scored: list[ScoredSample]) -> int:
        groups = layout.assemble(scored, self.prompts, self.encoded, self.job.spec.algorithm.group_size)
        self.history.record(records(groups, state))
        return len(groups)

    def close(self) -> None:
        """The run is done with this worker: its Redis keys go (RunHistory.close). Called by the step loop
        and, in this process, by the transport's stop too: the second call does nothing."""
        if not self.closed:
            self.closed = True
            self.history.close()
