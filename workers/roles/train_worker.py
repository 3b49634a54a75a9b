"""The train worker: the policy's master weights and optimiser. It trains on a step's kept groups,
writes the step's rollout dump (the replay buffer's record) and the checkpoints, and hands the new
weights to the rollout fleet."""

from __future__ import annotations

import copy
import os
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import torch

from rhymerl.api import RLJob
from rhymerl.api.roles import workers_per_pod
from rhymerl.api.spec import importance_level
from rhymerl.workers import dumps, faults
from rhymerl.workers.model.registry import load_policy
from rhymerl.workers.roles.groups import StepLayout, records
from rhymerl.workers.roles.rollout_worker import Weights
from rhymerl.workers.roles.samples import GroupKey, ScoredSample
from rhymerl.workers.roles.threads import apply_threads, use_threads
from rhymerl.workers.roles.train_samples import training_samples
from rhymerl.workers.roles.weight_layout import Group, Layout
from rhymerl.workers.roles.weight_sync import WeightSender
from rhymerl.workers.roles.worker_metrics import WorkerMetrics
from rhymerl.workers.run_folder.in_flight import NOTHING, InFlight, carried
from rhymerl.workers.run_folder.loop_state import LoopState
from rhymerl.workers.run_folder.run_dir import RunDir, RunDirError, pod_run_dir
from rhymerl.workers.task.prompts import encode_prompts, load_prompts
from rhymerl.workers.train import ranks
from rhymerl.workers.train.ranks import Ranks
from rhymerl.workers.train.trainer import Trainer, new_optimizer


class TrainWorker:
    """One rank of the train role. With one rank it is the whole role; with several (workers/train/
    ranks.py) every rank trains its share of each step, and rank 0 alone keeps the run folder
    (dumps, checkpoints), holds a whole copy of the weights to hand out and save, and answers the
    step loop's questions. Collective calls (every rank, together): `join`, `restore`, `step`,
    `save`; the others are rank 0's. Rank 0 also sends published weights to rollout workers over a
    broadcast (`weight_channel`, `send_weights`: workers/roles/weight_sync.py), beside its other
    calls on Ray (the `weights` concurrency group), from a copy no update touches."""

    CONCURRENCY_GROUPS: ClassVar[dict[str, int]] = {"weights": 4}
    """Sends run side by side: one whose receiver died holds its thread until the group's timeout
    (weight_sync.TIMEOUT), not the transfers to the worker that replaces it."""
    WEIGHTS: ClassVar[frozenset[str]] = frozenset({"weight_channel", "send_weights"})
    KEEP_VERSIONS = 2  # published versions the step loop may ask to send (a joiner may start on the one before)
    PUBLISH_WAIT_S = 60.0  # how long a send waits for its version to be handed out (start-up: `weights` runs beside)

    def __init__(self, job: RLJob, run: RunDir | str | None, threads: int | None = None,
                 pipelined: bool = False, rank: int = 0, world: int = 1) -> None:
        """run: the run folder (the step loop's own in its process, or its path on this machine);
        None on a pod: the run folder on the pod's own data volume. threads: torch's intra-op
        threads (None: the pod's CPU limit on a pod, else the process's setting). pipelined: rollout runs ahead of training
        (what `off_policy_correction: auto` decides on). rank, world: this rank among the train
        role's ranks (several: `join` them before anything else)."""
        self.threads = apply_threads(threads, share=workers_per_pod(job, "train"))  # a pod's ranks share its CPUs
        torch.manual_seed(job.spec.rollout.seed)
        spec = job.spec
        self.job = job
        self.ranks = Ranks(rank, world)
        self.pipelined = pipelined
        self.run = run if isinstance(run, RunDir) else RunDir(Path(run) if run else pod_run_dir())
        if rank == 0:
            self.run.path.mkdir(parents=True, exist_ok=True)
        self.device = "cuda" if spec.train.resources.gpu and torch.cuda.is_available() else "cpu"
        self.model, tok = load_policy(spec.model)  # on the CPU: the trainer shards it, then moves it
        self.model.checkpoint_activations(spec.model.activation_checkpointing)
        # rank 0's whole copy of the weights (and an optimiser over it, to save and restore in the
        # one-rank format); with one rank, the model itself
        self.whole = copy.deepcopy(self.model) if self.ranks.many and rank == 0 else self.model
        self.trainer: Trainer | None = None if self.ranks.many else self._trainer()
        self.whole_optimizer = self.trainer.optimizer if self.trainer else None
        self.prompts = {p.prompt_id: p for p in load_prompts(spec.data)}
        self.encoded = encode_prompts(tok, list(self.prompts.values()))
        self.metrics = WorkerMetrics("train")
        self._store: Any = None
        self.published: dict[int, Weights] = {}  # policy version -> its weights, as handed out
        self.restored: dict[int, Weights] = {}  # in-flight versions of the restored checkpoint
        self._handed_out = threading.Condition()
        self.sender: WeightSender | None = None

    def _trainer(self) -> Trainer:
        spec = self.job.spec
        return Trainer(self.model, spec.algorithm, spec.rollout.temperature,
                       correction=importance_level(spec, self.pipelined), ranks=self.ranks, device=self.device)

    def ping(self) -> int:
        return os.getpid()

    def listen(self) -> tuple[str, int]:
        """Rank 0: open the ranks' rendezvous; where the others find it."""
        self._store, host, port = ranks.listen()
        return host, port

    def join(self, host: str, port: int) -> None:
        """Join the ranks' process group and shard the model over them (collective)."""
        ranks.join(self.ranks, host, port, self._store)
        self.trainer = self._trainer()
        if self.ranks.rank == 0:
            self.whole_optimizer = new_optimizer(self.whole, self.job.spec.algorithm)

    def _active(self) -> Trainer:
        if self.trainer is None:
            raise RuntimeError(f"train rank {self.ranks.rank} of {self.ranks.world}: not joined to the others")
        return self.trainer

    def restore(self, recorded: int) -> tuple[LoopState, InFlight] | None:
        """Weights and optimiser of the newest intact checkpoint within the run's records (`recorded`:
        the steps the step loop's metrics hold, RunDir.restore); metrics and dumps cut back to it.
        Also what that checkpoint had in flight (run_folder/in_flight.py), whose other versions'
        weights `restored_weights` hands out. Rank 0 reads; every rank loads (None elsewhere)."""
        trainer = self._active()
        found = None
        if self.ranks.rank == 0:
            assert self.whole_optimizer is not None
            state = self.run.restore(self.whole, self.whole_optimizer, recorded)
            try:
                in_flight = InFlight.from_json(self.run.checkpoint_extra(state.step), state.policy_version)
            except ValueError as exc:
                raise RunDirError(f"{self.run.path}: checkpoint of step {state.step}: extra.json: {exc}") from None
            self.restored = {v: self.run.checkpoint_weights(state.step, InFlight.weights_file(v))
                             for v in carried(sorted(in_flight.versions()), state.policy_version)}
            found = state, in_flight
        if self.ranks.many:
            whole = self.ranks.rank == 0 and self.whole_optimizer is not None
            ranks.load_full_state(self.model, trainer.optimizer, self.whole.state_dict() if whole else {},
                                  self.whole_optimizer.state_dict() if whole and self.whole_optimizer else {})
        return found

    def restored_weights(self, version: int) -> Weights:
        """Rank 0: the weights of a policy version the restored checkpoint had in flight (handed out
        once: the fleet keeps them while they are in use)."""
        return self.restored.pop(version)

    def history_records(self) -> list[dumps.RolloutRecord]:
        """Every dumped response (what a history worker starting mid-run refills its store from)."""
        return dumps.read_run(self.run.path) if (self.run.path / dumps.DUMP_DIR).is_dir() else []

    def lengths(self) -> list[tuple[str, list[int]]]:
        """Each dumped group's response lengths, in step order (the step loop's length history)."""
        groups: dict[tuple[int, str], list[int]] = {}
        for rec in self.history_records():
            groups.setdefault((rec.step, rec.prompt_id), []).append(len(rec.response_ids))
        return [(pid, ls) for (_, pid), ls in groups.items()]

    def weights(self, version: int | None = None) -> Weights:
        """Copies under Hugging Face names, on the CPU; a tied output layer is the embedding's copy,
        not a second one. Rank 0. With `version`: also kept as that version's, to send."""
        copies: dict[int, torch.Tensor] = {}
        weights = {k: copies.setdefault(v.detach().data_ptr(), v.detach().cpu().clone())
                   for k, v in self.whole.hf_state_dict().items()}
        if version is not None:
            with self._handed_out:  # one more than the step loop asks for: it learns of a version after this
                self.published = {v: w for v, w in self.published.items() if v > version - self.KEEP_VERSIONS - 1}
                self.published[version] = weights
                self._handed_out.notify_all()
        return weights

    def weight_channel(self) -> tuple[str, int, Layout]:
        """Rank 0: open the store weight transfers meet at; where it is, and what a transfer carries."""
        if self.sender is None:
            self.sender = WeightSender()
        return self.sender.host, self.sender.port, Layout.of(self.weights())

    def send_weights(self, version: int, group: Group) -> float:
        """Broadcast a published version to a group of rollout workers; the seconds it took."""
        with self._handed_out:
            self._handed_out.wait_for(lambda: version in self.published, self.PUBLISH_WAIT_S)
            weights = self.published.get(version)
        if self.sender is None or weights is None:
            raise RuntimeError(f"policy version {version}: not among the versions kept to send "
                               f"({sorted(self.published)}) or no weight channel open")
        t0 = time.perf_counter()
        self.sender.send(group, weights)
        return time.perf_counter() - t0

    def step(self, state: LoopState, layout: StepLayout, kept: list[GroupKey],
             *scored: list[ScoredSample]) -> tuple[dict[str, float], Weights | None]:
        """Train on the kept groups of the step, then dump every group. `state` is the loop's state
        after the step. Returns the statistics and, if the weights changed, the new weights (rank
        0; the other ranks return no weights)."""
        use_threads(self.threads)  # a rollout worker in this process may have left its passes' count (adaptive_threads)
        trainer = self._active()
        lead = self.ranks.rank == 0
        groups = layout.assemble(scored, self.prompts, self.encoded, self.job.spec.algorithm.group_size)
        wanted = set(kept)
        # the weights this step starts from: the policy version before its update
        samples = training_samples([grp for grp in groups if (grp.epoch, grp.prompt.prompt_id) in wanted], self.job,
                                   state.step, state.policy_version - 1)
        t0 = time.perf_counter()
        stats = trainer.step(samples) if samples else {}
        if samples and self.ranks.many:
            whole, _ = ranks.full_state(self.model, None)
            if lead:
                self.whole.load_state_dict(whole)
        stats["time_train_s"] = time.perf_counter() - t0
        if not lead:
            return stats, None
        if samples and (trainer.skipped_samples or trainer.skipped_updates):
            self.run.note(f"step {state.step}: on_nonfinite=skip left out {len(trainer.skipped_samples)} "
                          f"sample(s) {trainer.skipped_samples} and {trainer.skipped_updates} update(s) "
                          "with a nan/inf value")
        dumps.write_step(self.run.path, state.step, list(records(groups, state)))
        faults.point("dump", state.step)
        self.metrics.call(stats["time_train_s"])
        self.metrics.flush()
        return stats, (self.weights(state.policy_version) if samples else None)

    def save(self, state: LoopState, in_flight: InFlight = NOTHING, *policies: Weights) -> str | None:
        """Write a checkpoint (collective: rank 0 gathers the whole state and writes it; None elsewhere).
        `in_flight`: what the pipeline had in flight; rank 0 gets `policies`, the weights of its
        versions other than `state`'s, in order (in_flight.carried)."""
        trainer = self._active()
        if self.ranks.many:
            whole, optimizer_state = ranks.full_state(self.model, trainer.optimizer)
            if self.ranks.rank != 0:
                return None
            assert self.whole_optimizer is not None
            self.whole.load_state_dict(whole)
            self.whole_optimizer.load_state_dict(optimizer_state)
        assert self.whole_optimizer is not None
        versions = carried(sorted(in_flight.versions()), state.policy_version)
        if len(policies) != len(versions):
            raise ValueError(f"checkpoint of step {state.step}: weights for versions {versions}, got {len(policies)}")
        return str(self.run.save_checkpoint(state, self.whole, self.whole_optimizer,
                                            self.job.spec.checkpoint.keep_last, in_flight.to_json(),
                                            {InFlight.weights_file(v): w for v, w in zip(versions, policies, strict=True)},
                                            self.job))
