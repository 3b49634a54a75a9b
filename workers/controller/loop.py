"""The RL step loop, one for every backend. `_steps` is the algorithm, one call per phase on a
role: sample the batch (rounds of rollout and reward on the fleet, with DAPO's dynamic sampling),
train on it (group-relative advantages, the update, the step's dump), record it in the drafting
history, load the new weights into the fleet, record the step, checkpoint.

The roles are the same classes everywhere (workers/roles/); a `Backend` says how they are reached:
in this process (`backend: local`, the embedded default, benches and tests: deterministic, the
tokens of one engine) or as Ray actors (`backend: ray` on this machine, the pods of a cluster).
At `max_off_policy_steps >= 1` a backend whose workers run beside the loop starts the next step's
first round before this step trains (batches.py); its samples are one policy version behind.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rhymerl.algorithms.drafting.cap_decisions import CapDecisions
from rhymerl.algorithms.scheduling.history import LengthHistory
from rhymerl.api import RLJob
from rhymerl.api.roles import train_ranks
from rhymerl.workers import dumps, faults
from rhymerl.workers.controller.batches import Batch, BatchSampler
from rhymerl.workers.controller.fleet import RolloutFleet, Round
from rhymerl.workers.controller.history_client import HistoryClient
from rhymerl.workers.controller.role_apis import HistoryAPI, RewardAPI, TrainAPI
from rhymerl.workers.controller.scale import ScaleFile
from rhymerl.workers.controller.stopping import GracefulStop
from rhymerl.workers.controller.train_role import TrainRole
from rhymerl.workers.controller.transport import Handle, LocalTransport, Transport, known, pipelined
from rhymerl.workers.controller.weight_broadcast import WeightBroadcast
from rhymerl.workers.history.run_history import history_run_id
from rhymerl.workers.model.tokenizer import load_job_tokenizer
from rhymerl.workers.reward.outcome import check_failures
from rhymerl.workers.roles.groups import GroupSummary
from rhymerl.workers.roles.history_worker import HistoryWorker
from rhymerl.workers.roles.reward_worker import RewardWorker
from rhymerl.workers.roles.rollout_worker import RolloutWorker
from rhymerl.workers.roles.train_worker import TrainWorker
from rhymerl.workers.rollout.generation import merged_counts
from rhymerl.workers.rollout.speculation import speculation_metrics
from rhymerl.workers.rollout.verify_cost import Progress
from rhymerl.workers.run_folder.in_flight import InFlight, carried
from rhymerl.workers.run_folder.loop_state import LoopState
from rhymerl.workers.run_folder.run_dir import RunDir
from rhymerl.workers.run_folder.step_metrics import StepMetrics
from rhymerl.workers.task.prompts import encode_prompts, load_prompts


@dataclass(frozen=True)
class Backend:
    """How the step loop reaches its role workers."""

    transport: Transport
    threads: int | None  # torch threads of each worker (None: this process's own)
    train_run: RunDir | str | None  # the train worker's run folder (None: on its pod's data volume)
    wanted: Callable[[], int]  # rollout workers wanted now
    notice: bool = False  # rollout workers take SIGTERM as a notice to leave (they are separate processes)
    say: Callable[[str], None] = lambda message: None  # what the run is waiting for (a status line)
    in_use: Callable[[int | None], None] = lambda pods: None  # the rollout pods holding workers (RolloutFleet)
    profile_progress: Progress | None = None  # the verify-cost measurement of a worker in this process


@dataclass
class Roles:
    train: TrainRole
    reward: list[Handle[RewardAPI]]
    history: HistoryClient
    fleet: RolloutFleet


def local_backend(job: RLJob, run: RunDir, profile_progress: Progress | None = None) -> Backend:
    """Every role worker in this process; `rhymerl scale` sets how many rollout workers."""
    return Backend(LocalTransport(), threads=None, train_run=run, wanted=ScaleFile(run.path, job),
                   profile_progress=profile_progress)


def run_steps(job: RLJob, run: RunDir, resume: bool = False, backend: Backend | None = None) -> Iterator[StepMetrics]:
    """The job's steps, one StepMetrics each; the role workers live as long as this generator.
    Without a backend every role runs in this process."""
    backend = backend or local_backend(job, run)
    t = backend.transport
    spec = job.spec
    ahead = pipelined(job, t)
    train = TrainRole(t, lambda rank, world: _start_train(t, job, backend, ahead, rank, world), train_ranks(job))
    n_reward = spec.reward.replicas if spec.reward.function is not None else 1
    reward: list[Handle[RewardAPI]] = [
        t.start("reward" if spec.reward.function is not None else "controller", RewardWorker, job)
        for _ in range(n_reward)]
    fleet: RolloutFleet | None = None
    history: HistoryClient | None = None
    try:
        lengths = LengthHistory()  # filled from the train worker's dumps below
        prompts = load_prompts(spec.data)
        encoded = encode_prompts(load_job_tokenizer(job), prompts)
        fleet = RolloutFleet(job, t, lengths, encoded, reward,
                             lambda: t.start("rollout", RolloutWorker, job, backend.threads, backend.profile_progress,
                                             backend.notice),
                             backend.wanted, run.note, backend.say, in_use=backend.in_use)
        fleet.reconcile()  # rollout workers start up (a model, the verify cost, a vLLM engine) as the trainer does
        state, resumed = _restore(train, run) if resume else (LoopState(), InFlight())
        if resume:
            run.cut_back(state.step)  # the loop's own records, where they are not the train worker's
        history = HistoryClient(t, lambda: _start_history(t, job, history_run_id(job, run.path)),
                                lambda: t.call(train.lead, TrainAPI.history_records), run.note)
        for pid, ls in t.get(t.call(train.lead, TrainAPI.lengths)):
            lengths.observe(pid, ls)
        broadcast = None
        if t.concurrent and spec.rollout.weight_sync == "collective":
            broadcast = WeightBroadcast(t, train.lead, t.get(t.call(train.lead, TrainAPI.weight_channel)))
        older = {v: t.call(train.lead, TrainAPI.restored_weights, v)
                 for v in carried(sorted(resumed.versions()), state.policy_version)}
        fleet.start(state.policy_version, t.call(train.lead, TrainAPI.weights, state.policy_version), history, older,
                    rounds_before=sum(m.gen_rounds for m in run.step_metrics()), broadcast=broadcast)
        roles = Roles(train, reward, history, fleet)
        sampler = BatchSampler(job, fleet, prompts, lengths, resumed)
        sampler.resume_ahead(state, resumed)
        yield from _steps(job, run, t, roles, sampler, state)
    finally:
        if fleet is not None:
            fleet.close()
        if history is not None:
            history.stop()
        for w in reward:
            t.stop(w)
        train.stop()


def _start_train(t: Transport, job: RLJob, backend: Backend, ahead: bool, rank: int, world: int) -> Handle[TrainAPI]:
    """A train rank (rank 0 on the role's lead pod); typed by its API: TrainWorker must match TrainAPI."""
    start = t.start_lead if rank == 0 else t.start
    return start("train", TrainWorker, job, backend.train_run, backend.threads, ahead, rank, world)


def _start_history(t: Transport, job: RLJob, run_id: str | None) -> Handle[HistoryAPI]:
    return t.start("history", HistoryWorker, job, run_id)


def _restore(train: TrainRole, run: RunDir) -> tuple[LoopState, InFlight]:
    found = train.get(train.call(TrainAPI.restore, run.recorded_steps()))
    if found is None:
        raise RuntimeError("the train worker of rank 0 restored no checkpoint state")
    return found


def _steps(job: RLJob, run: RunDir, t: Transport, roles: Roles, sampler: BatchSampler,
           state: LoopState) -> Iterator[StepMetrics]:
    spec, algo = job.spec, job.spec.algorithm
    prompts = len(sampler.prompts)
    with GracefulStop() as stop:
        while state.epoch <= algo.epochs:
            t_step = time.perf_counter()
            faults.point("rollout", state.step + 1)
            batch = sampler.sample_batch(state)
            faults.point("train", state.step + 1)
            scored, version_used = sampler.take(batch)
            before = state.policy_version
            state.step += 1
            state.policy_version += 1 if batch.kept else 0
            done = replace(state)  # the epoch the step's samples belong to, before any rollover
            t_train = time.perf_counter()
            stats_result, weights = roles.train.call2(TrainAPI.step, done, batch.layout, batch.kept,
                                                      *[t.arg(s) for s in scored])
            roles.history.record(done.step, done, batch.layout, *scored)
            if state.cursor >= prompts:
                state.epoch, state.cursor = state.epoch + 1, 0
            sampler.run_ahead(state)
            stats: dict[str, float] = dict(roles.train.get(stats_result))
            train_wait = time.perf_counter() - t_train
            if batch.kept:
                roles.fleet.publish(state.policy_version, known(weights))  # a step that kept groups made weights
            roles.fleet.end_step()
            roles.history.check_records()
            metrics = step_metrics(done, batch, stats, roles.fleet, time.perf_counter() - t_step, train_wait,
                                   before - version_used)
            advice = roles.fleet.recommend(sampler.next_prompts(state), batch.rounds, metrics.time_train_s,
                                           metrics.tokens_per_pass)
            metrics.fleet_recommended = advice.workers
            run.append_metrics(metrics.row())
            check_failures([e for _, g in batch.groups for e in g.reward_errors], spec.reward, state.step,
                           dumps.dump_path(run.path, state.step))
            faults.point("metrics", state.step)
            saved = state.step % spec.checkpoint.every_steps == 0 or state.epoch > algo.epochs
            if saved:
                _save(roles, state, sampler)
            yield metrics
            if stop.requested and state.epoch <= algo.epochs:
                if not saved:
                    _save(roles, state, sampler)
                stop.check(state.step)


def _save(roles: Roles, state: LoopState, sampler: BatchSampler) -> None:
    """A checkpoint of the train role, with what the pipeline has in flight and those versions'
    weights (run_folder/in_flight.py): a resume re-creates it, so it equals the uninterrupted run."""
    in_flight = sampler.in_flight()
    older = tuple(roles.fleet.weights[v] for v in carried(sorted(in_flight.versions()), state.policy_version))
    roles.train.get(roles.train.save(replace(state), in_flight, older))


def step_metrics(state: LoopState, batch: Batch, train_stats: dict[str, float], fleet: RolloutFleet,
                 step_s: float, train_wait_s: float, lag: int) -> StepMetrics:
    """The step's row (docs/formats.md): the same keys with the same meaning on every backend."""
    groups: list[GroupSummary] = [g for _, g in batch.groups]
    lengths = [n for g in groups for n in g.lengths]
    rewards = [x for g in groups for x in g.rewards]
    tokens = sum(lengths)
    rounds = batch.rounds
    rollout_s = sum(r.generated - r.started for r in rounds)
    stats = dict(train_stats)
    train_s = stats.pop("time_train_s", 0.0)
    gap = {k: stats.pop(k) for k in ("rollout_logprob_diff_mean", "rollout_logprob_diff_max") if k in stats}
    history = [r.history_ok for r in rounds if r.history_ok is not None]
    reruns, fleet.reruns = fleet.reruns, 0
    sync_s, fallbacks = fleet.weight_sync()
    return StepMetrics(
        step=state.step,
        epoch=state.epoch,
        policy_version=state.policy_version,
        prompts=len(groups),
        samples=len(lengths),
        gen_rounds=len(rounds),
        time_rollout_s=round(rollout_s, 3),
        time_reward_s=round(sum(r.scored - r.generated for r in rounds), 3),
        time_train_s=round(train_s, 3),
        rollout_tokens=tokens,
        rollout_tokens_per_s=round(tokens / max(rollout_s, 1e-9), 1),
        response_length_mean=round(sum(lengths) / max(len(lengths), 1), 1),
        response_length_max=max(lengths, default=0),
        reward_mean=round(sum(rewards) / max(len(rewards), 1), 4),
        reward_failures=sum(e is not None for g in groups for e in g.reward_errors),
        zero_std_frac=round(sum(len(set(g.rewards)) <= 1 for g in groups) / max(len(groups), 1), 4),
        **{k: (round(v, 5) if math.isfinite(v) else v) for k, v in stats.items()},
        **speculation_metrics(tokens, sum(g.drafted for g in groups), sum(g.accepted for g in groups),
                              sum(g.forward_passes for g in groups), merged_counts(g.by_source for g in groups)),
        **fleet_metrics(rounds, fleet.live_count(), fleet.wanted()),
        **gap,
        time_step_s=round(step_s, 3),
        weight_sync_s=round(sync_s, 4),
        weight_fallbacks=fallbacks,
        time_wait_rollout_s=round(batch.waited_s, 3),
        time_wait_train_s=round(train_wait_s, 3),
        policy_lag_max=lag,
        history_ok=all(history) if history else None,
        worker_reruns=reruns,
    )


def fleet_metrics(rounds: Sequence[Round], live: int, wanted: int) -> dict[str, Any]:
    """What the rollout workers did in a step's rounds. Busy: each worker's time working on the
    step's calls; makespan: from a round's start until its last worker finished its share, summed
    over rounds; bubble: the idle share of the workers' time over the makespans."""
    busy: dict[int, float] = {}
    makespan = worker_time = 0.0
    for r in rounds:
        span = max(r.ends.values(), default=r.clock0) - r.clock0
        makespan += span
        worker_time += len(r.workers) * span
        for call, summary in r.summaries:
            busy[call.member.id] = busy.get(call.member.id, 0.0) + summary.rollout_seconds
    counts = {k: sum(r.counts[k] for r in rounds) for k in ("migrated", "stolen", "deferred", "handed_back")}
    return {
        "rollout_workers": len({w for r in rounds for w in r.workers}),
        "rollout_workers_live": live,
        "rollout_workers_wanted": wanted,
        "rollout_busy_s": [round(busy[w], 3) for w in sorted(busy)],
        "rollout_makespan_s": round(makespan, 3),
        "rollout_bubble": round(max(0.0, 1.0 - sum(busy.values()) / worker_time), 4) if worker_time > 0 else 0.0,
        "rollout_migrated": counts["migrated"],
        "rollout_stolen": counts["stolen"],
        "rollout_deferred": counts["deferred"],
        "rollout_handed_back": counts["handed_back"],
        "rollout_resumed_tokens": sum(s.resumed_tokens for r in rounds for _, s in r.summaries),
        "rollout_group_tokens_heard": sum(s.heard_tokens for r in rounds for _, s in r.summaries),
        "draft_cap_by_batch": sum((s.cap_decisions for r in rounds for _, s in r.summaries),
                                  CapDecisions()).summary(),
        "rollout_drafting_workers": max((r.drafting for r in rounds), default=0),
        "rollout_consolidations": sum(r.consolidations for r in rounds),
        "schedule_ranking": rounds[0].ranking if rounds else "none",
    }
