"""A rollout fleet of workers in this process with its own train, reward and history workers, wired as
run_steps wires one (workers/controller/loop.py), for tests that drive its rounds themselves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.history import LengthHistory
from rhymerl.api import RLJob
from rhymerl.workers.controller.fleet import RolloutFleet, Round
from rhymerl.workers.controller.history_client import HistoryClient
from rhymerl.workers.controller.role_apis import TrainAPI
from rhymerl.workers.controller.transport import LocalTransport
from rhymerl.workers.model.tokenizer import load_job_tokenizer
from rhymerl.workers.roles.history_worker import HistoryWorker
from rhymerl.workers.roles.reward_worker import RewardWorker
from rhymerl.workers.roles.rollout_worker import RolloutWorker
from rhymerl.workers.roles.samples import ScoredSample
from rhymerl.workers.roles.train_worker import TrainWorker
from rhymerl.workers.run_folder.run_dir import RunDir
from rhymerl.workers.task.prompts import encode_prompts, load_prompts

Tokens = dict[tuple[str, int], tuple[int, ...]]


class InProcessFleet:
    def __init__(self, job: RLJob, path: Path, wanted: Callable[[], int] | None = None,
                 scheduler: Scheduler | None = None) -> None:
        self.job = job
        self.in_use: list[int | None] = []  # the rollout pods holding workers, as the fleet reports them
        t = self.t = LocalTransport()
        run = RunDir(path)
        run.create(job)
        self.notes: list[str] = []
        self.train = t.start("train", TrainWorker, job, run)
        history = HistoryClient(t, lambda: t.start("history", HistoryWorker, job), list, self.notes.append)
        self.encoded = encode_prompts(load_job_tokenizer(job), load_prompts(job.spec.data))
        self.fleet = RolloutFleet(job, t, LengthHistory(), self.encoded, [t.start("reward", RewardWorker, job)],
                                  lambda: t.start("rollout", RolloutWorker, job),
                                  wanted or (lambda: job.spec.rollout.replicas), self.notes.append, self.notes.append,
                                  in_use=self.in_use.append, scheduler=scheduler)
        self.fleet.start(0, t.get(t.call(self.train, TrainAPI.weights)), history)

    def round(self, prompts: list[str], epoch: int = 1) -> tuple[Tokens, Round]:
        """One round of these prompts' groups: every response's tokens (each generated once), and the round."""
        rnd = self.fleet.launch([(epoch, p) for p in prompts], step=1, inter_step=False)
        out: Tokens = {}
        for _, scored in self.fleet.collect(rnd):
            s: ScoredSample
            for s in self.t.get(scored):
                assert (s.sample.prompt_id, s.sample.index) not in out, "a sample generated twice"
                out[(s.sample.prompt_id, s.sample.index)] = tuple(s.result.response_ids)
        return out, rnd
