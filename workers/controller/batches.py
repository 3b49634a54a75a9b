"""A step's batch: scheduling rounds on the rollout fleet until the step has its prompts' groups,
with DAPO's dynamic sampling, and the books of groups across rounds.

Dynamic sampling lives here, behind the rollout interface (as slime has it): a round launches the
next prompts of the epoch; while groups whose rewards are all equal (no learning signal) leave the
batch short, more rounds draw more prompts, up to `max_gen_batches`. A group completes in the round
its last response is scored, which with inter-step migration may be a later step's round (its
outlier was deferred); every response of a group comes from one policy version.

With `max_off_policy_steps >= 1` on a backend whose workers run beside the step loop, the first
round of step n+1 is launched before step n trains (`run_ahead`): rollout overlaps training and
its samples are one policy version behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rhymerl.algorithms.scheduling.history import LengthHistory
from rhymerl.api import RLJob
from rhymerl.workers.controller.fleet import RolloutFleet, Round
from rhymerl.workers.controller.transport import Result, pipelined
from rhymerl.workers.roles.groups import GroupSummary, StepLayout
from rhymerl.workers.roles.samples import GroupKey, SampleRef, SampleSummary, ScoredSample
from rhymerl.workers.rollout.generation import merged_counts
from rhymerl.workers.run_folder.in_flight import NOTHING, InFlight
from rhymerl.workers.run_folder.loop_state import LoopState
from rhymerl.workers.task.prompts import Prompt, epoch_order


@dataclass
class Batch:
    """A step's rollout: every group it completed (dumped and learnt from), those kept for training
    (with dynamic sampling, groups whose rewards differ), and the rounds that made them."""

    groups: list[tuple[GroupKey, GroupSummary]] = field(default_factory=list)
    kept: list[GroupKey] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    waited_s: float = 0.0  # the step loop waiting for the rounds (less when one ran ahead)

    @property
    def layout(self) -> StepLayout:
        return StepLayout([key for key, _ in self.groups])


@dataclass
class _Finished:
    summary: SampleSummary
    version: int
    scored: Result[list[ScoredSample]]  # the scored samples of its call


class BatchSampler:
    def __init__(self, job: RLJob, fleet: RolloutFleet, prompts: list[Prompt], lengths: LengthHistory,
                 resumed: InFlight = NOTHING) -> None:
        """resumed: what the checkpoint a run resumes from had in flight; the groups it left open
        (an outlier of theirs was deferred past it) are generated again, whole, at the policy
        version they had, in the first round (`resume_ahead` starts that round as the
        uninterrupted run did)."""
        self.job, self.fleet, self.prompts, self.lengths = job, fleet, prompts, lengths
        self.again = resumed.open_groups()
        self.open: dict[GroupKey, int] = {}  # groups launched and not complete, in launch order -> their version
        self.finished: dict[SampleRef, _Finished] = {}
        self.ahead: Round | None = None

    def sample_batch(self, state: LoopState) -> Batch:
        """Roll out and score the next prompts of the epoch (advancing `state.cursor`)."""
        algo = self.job.spec.algorithm
        assert algo.dynamic_sampling is not None
        dynamic = algo.dynamic_sampling
        order = self._order(state.epoch)
        batch = Batch()
        while state.cursor < len(order) and len(batch.kept) < algo.prompts_per_step and (
                not batch.rounds or (dynamic.enabled and len(batch.rounds) < dynamic.max_gen_batches)):
            take = [self.prompts[i] for i in order[state.cursor: state.cursor + algo.prompts_per_step - len(batch.kept)]]
            state.cursor += len(take)
            rnd = self.ahead
            if rnd is not None and (rnd.prompts != [p.prompt_id for p in take] or rnd.epoch != state.epoch):
                raise RuntimeError(f"step {state.step + 1}: the round started ahead has prompts {rnd.prompts} of "
                                   f"epoch {rnd.epoch}, the step wants {[p.prompt_id for p in take]}")
            if rnd is None:
                rnd = self._launch(take, state.epoch, state.step + 1, state.cursor)
            self.ahead = None
            t0 = time.perf_counter()
            got = self._collect(rnd)
            batch.waited_s += time.perf_counter() - t0
            batch.rounds.append(rnd)
            batch.groups += got
            batch.kept += [key for key, g in got if not dynamic.enabled or g.informative]
        return batch

    def run_ahead(self, state: LoopState, version: int | None = None) -> None:
        """Launch the next step's first round now, if the job and the backend allow it; `version`: the
        policy version it starts with (None: the fleet's current one)."""
        algo = self.job.spec.algorithm
        if not pipelined(self.job, self.fleet.transport) or state.epoch > algo.epochs:
            return
        by_id = {p.prompt_id: p for p in self.prompts}
        take = [by_id[pid] for pid in self.next_prompts(state)]
        self.ahead = self._launch(take, state.epoch, state.step + 1, state.cursor + len(take), version)

    def resume_ahead(self, state: LoopState, resumed: InFlight) -> None:
        """A resumed run: launch the round the checkpointed run had started ahead, with the policy
        version it had."""
        if resumed.ahead is not None:
            self.run_ahead(state, resumed.ahead)

    def next_prompts(self, state: LoopState) -> list[str]:
        """The prompts the next step starts with (none after the last step)."""
        if state.epoch > self.job.spec.algorithm.epochs:
            return []
        order = self._order(state.epoch)
        return [self.prompts[i].prompt_id for i in order[state.cursor: state.cursor + self.job.spec.algorithm.prompts_per_step]]

    def take(self, batch: Batch) -> tuple[list[Result[list[ScoredSample]]], int]:
        """The scored samples holding the batch's groups' responses (by call), and the oldest policy
        version among them; the groups' books are closed."""
        g = self.job.spec.algorithm.group_size
        scored: dict[int, Result[list[ScoredSample]]] = {}
        versions = []
        for epoch, pid in batch.layout.groups:
            for k in range(g):
                f = self.finished.pop(SampleRef(pid, k, epoch))
                scored[id(f.scored)] = f.scored
                versions.append(f.version)
        self.fleet.forget([SampleRef(pid, k, e) for e, pid in batch.layout.groups for k in range(g)])
        return list(scored.values()), min(versions, default=self.fleet.version)

    def in_flight(self) -> InFlight:
        """What a checkpoint taken now must record: the round started ahead (a resumed run starts it
        again itself, from the state) and the other groups launched and not complete, with the
        policy version each started with."""
        ahead = [(self.ahead.epoch, pid) for pid in self.ahead.prompts] if self.ahead is not None else []
        version = self.open[ahead[0]] if ahead else None
        return InFlight(version, {key: v for key, v in self.open.items() if key not in set(ahead)})

    # ------------------------------------------------------------------ internals
    def _order(self, epoch: int) -> list[int]:
        data = self.job.spec.data
        return epoch_order(len(self.prompts), data.seed, epoch, data.shuffle)

    def _launch(self, take: list[Prompt], epoch: int, step: int, cursor_after: int,
                version: int | None = None) -> Round:
        fresh = self.fleet.version if version is None else version
        versions = self.again | {(epoch, p.prompt_id): fresh for p in take}
        self.again = {}
        self.open |= versions
        later = cursor_after < len(self.prompts) or epoch < self.job.spec.algorithm.epochs
        inter_step = pipelined(self.job, self.fleet.transport) and later
        rnd = self.fleet.launch(list(versions), step, inter_step, versions=versions)
        rnd.prompts = [p.prompt_id for p in take]
        return rnd

    def _collect(self, rnd: Round) -> list[tuple[GroupKey, GroupSummary]]:
        """The round's results; the groups it completed (its own, and earlier ones whose deferred
        outliers it finished), in launch order."""
        for summary, scored in self.fleet.collect(rnd):
            for s in summary.samples:
                if s.sample in self.finished:
                    raise RuntimeError(f"sample {s.sample}: scored twice")
                self.finished[s.sample] = _Finished(s, summary.policy_version, scored)
        g = self.job.spec.algorithm.group_size
        done = [key for key in self.open if all(SampleRef(key[1], k, key[0]) in self.finished for k in range(g))]
        out = []
        for key in done:
            del self.open[key]
            ss = [self.finished[SampleRef(key[1], k, key[0])].summary for k in range(g)]
            group = GroupSummary(key[1], [s.length for s in ss], [s.reward for s in ss], [s.error for s in ss],
                                 sum(s.drafted for s in ss), sum(s.accepted for s in ss),
                                 sum(s.forward_passes for s in ss), merged_counts(s.by_source for s in ss))
            self.lengths.observe(group.prompt_id, group.lengths)
            out.append((key, group))
        return out
