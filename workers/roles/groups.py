"""A prompt's group of responses in a step, and what the roles compute from groups: scores, the
rollout dump's records. Torch-free, for the reward and history workers; the train worker's
advantages are train_samples.py."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from rhymerl.api import RLJob
from rhymerl.errors import NonFiniteError
from rhymerl.workers import dumps
from rhymerl.workers.model.tokenizer import Tokenizer
from rhymerl.workers.reward.outcome import Outcome
from rhymerl.workers.reward.pool import Scorer
from rhymerl.workers.roles.samples import GroupKey, SampleRef, ScoredSample
from rhymerl.workers.rollout.generation import GenResult, SourceCount
from rhymerl.workers.run_folder.loop_state import LoopState
from rhymerl.workers.task.prompts import Prompt, prompt_text


@dataclass
class Group:
    """One prompt's G responses in a step."""

    prompt: Prompt
    prompt_ids: list[int]
    results: list[GenResult]
    rewards: list[float]
    reward_errors: list[str | None]  # why scoring each response failed; None where it scored
    policy_version: int  # of the weights that generated it
    epoch: int  # the epoch whose visit of the prompt it is


@dataclass(frozen=True)
class GroupSummary:
    """What the step's bookkeeping needs of a group (dynamic sampling, metrics, length history,
    reward failures): a few numbers per response, never its tokens."""

    prompt_id: str
    lengths: list[int]
    rewards: list[float]
    reward_errors: list[str | None]
    drafted: int
    accepted: int
    forward_passes: int
    by_source: dict[str, SourceCount] = field(default_factory=dict)

    @property
    def informative(self) -> bool:
        """Rewards that differ: the group carries a learning signal (DAPO dynamic sampling keeps it)."""
        return len(set(self.rewards)) > 1


@dataclass(frozen=True)
class StepLayout:
    """The groups a step completed, in order; the scored samples passed with it hold their
    responses (and may hold responses of groups an outlier deferred to a later step: those are
    left for it)."""

    groups: list[GroupKey]

    def assemble(self, scored: Sequence[Sequence[ScoredSample]], prompts: Mapping[str, Prompt],
                 encoded: Mapping[str, list[int]], group_size: int) -> list[Group]:
        """The groups from scored samples spread over calls (any placement), each group's responses
        by sample index. Every response must be there once; one group's from one policy version."""
        by_sample: dict[SampleRef, ScoredSample] = {}
        for part in scored:
            for s in part:
                if by_sample.setdefault(s.sample, s) is not s:
                    raise RuntimeError(f"sample {s.sample}: scored twice")
        groups = []
        for epoch, pid in self.groups:
            refs = [SampleRef(pid, k, epoch) for k in range(group_size)]
            if missing := [r.index for r in refs if r not in by_sample]:
                raise RuntimeError(f"prompt {pid} of epoch {epoch}: responses {missing} did not arrive")
            samples = [by_sample[r] for r in refs]
            versions = {s.policy_version for s in samples}
            if len(versions) != 1:
                raise RuntimeError(f"prompt {pid}: responses of one group from policy versions {sorted(versions)}")
            groups.append(Group(prompts[pid], encoded[pid], [s.result for s in samples], [s.reward for s in samples],
                                [s.error for s in samples], versions.pop(), epoch))
        return groups


def score_samples(job: RLJob, scorer: Scorer, tok: Tokenizer, samples: Sequence[tuple[Prompt, int, GenResult]],
                  step: int) -> list[Outcome]:
    """Reward each (prompt, sample index, response); a nan/inf reward stops the run under
    `on_nonfinite: fail`."""
    outcomes = scorer.score([(prompt_text(tok, p), tok.decode(r.response_ids), p.answer, p.reward_extras())
                            for p, _, r in samples])
    if job.spec.algorithm.on_nonfinite == "fail":
        for (p, k, _), o in zip(samples, outcomes, strict=True):
            if o.nonfinite is not None:
                raise NonFiniteError(f"step {step}: prompt {p.prompt_id} sample {k}: the reward function returned "
                                     f"{o.nonfinite}; no weight was changed; set algorithm.on_nonfinite: skip to "
                                     "score such samples as failures (reward.failure_reward) instead")
    return outcomes


def records(groups: list[Group], state: LoopState) -> Iterator[dumps.RolloutRecord]:
    for g in groups:
        for k, (res, reward, error) in enumerate(zip(g.results, g.rewards, g.reward_errors, strict=True)):
            yield dumps.RolloutRecord(
                step=state.step, epoch=g.epoch, prompt_id=g.prompt.prompt_id, sample_index=k,
                prompt_len=len(g.prompt_ids), prompt_ids=g.prompt_ids, response_ids=res.response_ids,
                reward=reward, reward_error=error, finish_reason="stop" if res.finish_reason == "stop" else "length",
                policy_version=g.policy_version,
                speculation=dumps.SpeculationStats(
                    drafted=res.drafted, accepted=res.accepted, forward_passes=res.forward_passes,
                    sources={name: dumps.SourceStats(passes=c.passes, drafted=c.drafted, accepted=c.accepted)
                             for name, c in res.by_source.items()}))
