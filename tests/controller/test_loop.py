"""The step loop end to end on a tiny random model: dumps, metrics, checkpoints, exact resume."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

import pytest
import redis
import torch
from jobs import make_job

from rhymerl.api import RLJob
from rhymerl.api.roles import Role
from rhymerl.workers import dumps
from rhymerl.workers.controller.loop import local_backend, run_steps
from rhymerl.workers.controller.transport import Handle, LocalTransport, Result
from rhymerl.workers.model.transformer import load_model
from rhymerl.workers.run_folder.run_dir import RunDir, RunDirError
from rhymerl.workers.run_folder.step_metrics import deterministic


def _run(job: RLJob, path: Path, steps: int | None = None, resume: bool = False) -> list[dict[str, object]]:
    run = RunDir(path)
    if not resume:
        run.create(job)
    return [m.row() for m in itertools.islice(run_steps(job, run, resume), steps)]  # as metrics.jsonl has them


def strip_timing(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """What two runs of one job must agree on (not what is measured with a clock)."""
    return [deterministic(r) for r in rows]


def test_a_run_writes_one_dump_per_step_with_every_prompt_each_epoch(model_dir: Path, tmp_path: Path) -> None:
    rows = _run(make_job(f"model.path={model_dir}"), tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    records = dumps.read_run(tmp_path / "run")
    per_epoch = dumps.by_epoch(records)
    assert sorted(per_epoch) == [1, 2]
    for recs in per_epoch.values():
        assert sorted((r.prompt_id, r.sample_index) for r in recs) == sorted(
            (f"ac-0-{i:05d}", k) for i in range(4) for k in range(2))
    assert [r.policy_version for r in records if r.step == 3] == [2] * 4
    assert len(RunDir(tmp_path / "run").checkpoint_dirs()) == 2


P = ParamSpec("P")
A = TypeVar("A")
W = TypeVar("W")
R = TypeVar("R")


class _Order(LocalTransport):
    """LocalTransport that records which roles start and which calls the train worker is asked, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []
        self.roles: dict[int, Role] = {}

    def start(self, role: Role, cls: Callable[P, W], *args: P.args, **kwargs: P.kwargs) -> Handle[W]:
        handle = super().start(role, cls, *args, **kwargs)
        self.roles[id(handle)] = role
        self.events.append(f"start {role}")
        return handle

    def start_lead(self, role: Role, cls: Callable[P, W], *args: P.args, **kwargs: P.kwargs) -> Handle[W]:
        return self.start(role, cls, *args, **kwargs)

    def call(self, handle: Handle[A], method: Callable[Concatenate[A, P], R], *args: P.args,
             **kwargs: P.kwargs) -> Result[R]:
        if self.roles.get(id(handle)) == "train":
            self.events.append(f"train {method.__name__}")
        return super().call(handle, method, *args, **kwargs)


def test_rollout_workers_start_before_the_step_loop_waits_on_the_trainer(model_dir: Path, tmp_path: Path) -> None:
    """On a cluster a rollout worker's start-up (a model to load, a vLLM engine to build) and the train
    worker's are minutes each: the fleet's workers are started before the loop asks the trainer
    anything it must wait for (in a new run and in a resumed one), so the two overlap."""
    job = make_job(f"model.path={model_dir}")
    _run(job, tmp_path / "run", steps=2)
    # a new run's first call to the trainer is for the history worker's refill (whose result the step
    # loop hands on without waiting for it); a resumed run's is the restore
    for resume, first_calls in ((False, ["start history", "train history_records"]), (True, ["train restore"])):
        run = RunDir(tmp_path / "run" if resume else tmp_path / "new")
        if not resume:
            run.create(job)
        order = _Order()
        next(run_steps(job, run, resume, backend=dataclasses.replace(local_backend(job, run), transport=order)))
        first = next(i for i, e in enumerate(order.events) if e.startswith("train "))
        assert order.events[:first + 1] == ["start train", "start controller", "start rollout", *first_calls]


def test_the_torch_engine_samples_from_the_trainers_distribution_so_importance_ratios_are_one(
        model_dir: Path, tmp_path: Path) -> None:
    """Off-policy 0 on the torch engine: every token's behaviour log-probability is the trainer's
    own (float rounding apart: the engine's cached forward is not the trainer's full one), and
    `auto` leaves the correction off. At temperature 0.7 and top_p 0.9 the ratio is the nucleus
    mass at most: below 1 where top-p cut something, never above."""
    job = make_job(f"model.path={model_dir}")
    rows = _run(job, tmp_path / "run")
    assert all(abs(float(str(r["is_ratio_mean"])) - 1.0) < 1e-4 and float(str(r["is_ratio_max"])) < 1 + 1e-4
               and float(str(r["rollout_logprob_diff_max"])) < 1e-4 for r in rows)
    job.spec.rollout.temperature, job.spec.rollout.top_p = 0.7, 0.9
    nucleus = _run(job, tmp_path / "nucleus", steps=1)[0]
    assert float(str(nucleus["is_ratio_max"])) < 1 + 1e-4 and float(str(nucleus["is_ratio_mean"])) < 0.999


def test_a_resumed_run_ends_exactly_where_an_uninterrupted_one_does(model_dir: Path, tmp_path: Path) -> None:
    job = make_job(f"model.path={model_dir}")
    full = _run(job, tmp_path / "full")
    _run(job, tmp_path / "cut", steps=2)
    # a step that ran after the last checkpoint but "crashed" before finishing leaves no trace
    (tmp_path / "cut" / "rollouts" / "step_000003.jsonl.tmp").write_text("partial")
    resumed = _run(job, tmp_path / "cut", resume=True)
    assert [r["step"] for r in resumed] == [3, 4]
    assert strip_timing(RunDir(tmp_path / "cut").metrics()) == strip_timing(full)
    a = load_model(RunDir(tmp_path / "full").checkpoint_dirs()[-1])
    b = load_model(RunDir(tmp_path / "cut").checkpoint_dirs()[-1])
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert [r.response_ids for r in dumps.read_run(tmp_path / "cut")] == [
        r.response_ids for r in dumps.read_run(tmp_path / "full")]


def test_dynamic_sampling_only_trains_on_groups_with_reward_signal(model_dir: Path, tmp_path: Path) -> None:
    job = make_job(f"model.path={model_dir}")
    job.spec.algorithm.name = "dapo"  # set after validation: GRPO's resolved defaults kept
    job.spec.algorithm.dynamic_sampling.enabled = True  # type: ignore[union-attr]
    rows = _run(job, tmp_path / "run")
    # the random model never solves a chain: every group is all-zero, so nothing is trained on,
    # and each step draws up to max_gen_batches rounds of prompts from the epoch
    assert all(r["zero_std_frac"] == 1.0 for r in rows)
    assert all(r["policy_version"] == 0 for r in rows)
    assert sum(r["prompts"] for r in rows) == 8


def test_a_non_empty_run_folder_is_not_overwritten(model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("x")
    with pytest.raises(RunDirError, match="--resume"):
        RunDir(tmp_path / "run").create(make_job(f"model.path={model_dir}"))


FLEET_KEYS = {"rollout_workers", "rollout_workers_live", "rollout_workers_wanted", "rollout_busy_s",
              "rollout_makespan_s", "rollout_bubble", "rollout_migrated", "rollout_stolen", "rollout_deferred",
              "rollout_handed_back", "rollout_resumed_tokens", "rollout_group_tokens_heard", "schedule_ranking"}


def test_more_rollout_workers_run_the_scheduler_and_change_no_token_reward_or_weight(
        model_dir: Path, tmp_path: Path) -> None:
    one = make_job(f"model.path={model_dir}")
    two = make_job(f"model.path={model_dir}")
    two.spec.rollout.replicas = two.spec.rollout.max_replicas = 2
    rows_one, rows_two = _run(one, tmp_path / "one"), _run(two, tmp_path / "two")
    assert [r.response_ids for r in dumps.read_run(tmp_path / "two")] == [
        r.response_ids for r in dumps.read_run(tmp_path / "one")]
    without_fleet = [{k: v for k, v in r.items() if k not in FLEET_KEYS} for r in strip_timing(rows_two)]
    assert without_fleet == [{k: v for k, v in r.items() if k not in FLEET_KEYS} for r in strip_timing(rows_one)]
    assert all(r.keys() >= FLEET_KEYS for r in rows_one + rows_two)  # one fleet, whatever its size
    assert [r["rollout_workers"] for r in rows_one] == [1] * 4 and [r["rollout_workers"] for r in rows_two] == [2] * 4
    assert [r["schedule_ranking"] for r in rows_two] == ["prompt-length", "prompt-length", "history", "history"]
    # each group ran on both workers: each heard the other's siblings (one worker hears nobody)
    assert {r["rollout_group_tokens_heard"] for r in rows_one} == {0}
    assert all(int(str(r["rollout_group_tokens_heard"])) > 0 for r in rows_two)
    for r in rows_two:
        busy, makespan = r["rollout_busy_s"], r["rollout_makespan_s"]
        assert isinstance(busy, list) and isinstance(makespan, float)
        assert len(busy) == 2 and makespan >= max(busy)


def test_a_resumed_multi_replica_run_makes_the_same_scheduling_decisions(model_dir: Path, tmp_path: Path) -> None:
    job = make_job(f"model.path={model_dir}")
    job.spec.rollout.replicas = job.spec.rollout.max_replicas = 2
    full = _run(job, tmp_path / "full")
    _run(job, tmp_path / "cut", steps=2)
    resumed = _run(job, tmp_path / "cut", resume=True)
    assert [r["step"] for r in resumed] == [3, 4]
    assert strip_timing(RunDir(tmp_path / "cut").metrics()) == strip_timing(full)


def test_a_run_drafting_from_redis_makes_the_tokens_of_one_drafting_from_memory_and_resumes(
        model_dir: Path, tmp_path: Path, redis_url: str) -> None:
    memory_job, redis_job = (make_job(f"model.path={model_dir}") for _ in range(2))
    redis_job.spec.history.store, redis_job.spec.history.redis_url = "redis", redis_url
    _run(memory_job, tmp_path / "memory")
    _run(redis_job, tmp_path / "cut", steps=3)  # epoch 2's first step drafts from Redis
    _run(redis_job, tmp_path / "cut", resume=True)  # the Redis history is rebuilt from the dumps
    memory, cut = dumps.read_run(tmp_path / "memory"), dumps.read_run(tmp_path / "cut")
    assert [(r.response_ids, r.reward) for r in cut] == [(r.response_ids, r.reward) for r in memory]
    assert sum(r.speculation.drafted for r in cut if r.epoch == 2) > 0  # history drafting did run
    assert redis.Redis.from_url(redis_url).keys("*") == []  # the finished run deleted its own keys


def test_a_first_epoch_drafts_from_the_earlier_steps_responses_to_other_prompts(model_dir: Path, tmp_path: Path) -> None:
    with_recent, without = (make_job(f"model.path={model_dir}", "algorithm.epochs=1") for _ in range(2))
    for job, budget in ((with_recent, 1 << 18), (without, 0)):
        job.spec.rollout.speculation.group_drafts = False  # no other source: what drafts is the recent window
        job.spec.rollout.speculation.recent_tokens = budget
        # the fixed rule (drafts at every batch size), not the cap priced on this machine's measured pass times
        job.spec.rollout.speculation.disable_above_batch = 1024
    _run(with_recent, tmp_path / "recent")
    _run(without, tmp_path / "none")
    recent, none = dumps.read_run(tmp_path / "recent"), dumps.read_run(tmp_path / "none")
    assert [r.response_ids for r in recent] == [r.response_ids for r in none]
    drafted = {(name, step): sum(r.speculation.drafted for r in recs if r.step == step)
               for name, recs in (("recent", recent), ("none", none)) for step in (1, 2)}
    assert drafted == {("recent", 1): 0, ("none", 1): 0, ("none", 2): 0, ("recent", 2): drafted["recent", 2]}
    assert drafted["recent", 2] > 0  # step 2's prompts are new: they drafted from step 1's answers to others
