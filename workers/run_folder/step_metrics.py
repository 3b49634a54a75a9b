"""What one step did, typed: the loop makes it, metrics.jsonl stores it (one line per step,
docs/formats.md), the console, the plots and the RLJob status read it.

Fields that only some steps have (training statistics of a step that trained, the counts of
`on_nonfinite: skip`, the engine's log-probability gap) are left unset otherwise and then absent
from the line. Every backend writes the same keys with the same meaning.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

MEASURED = frozenset({"spec_rate", "spec_acceptance", "tokens_per_pass", "spec_sources", "draft_cap_by_batch",
                      "rollout_busy_s", "rollout_makespan_s", "rollout_bubble", "rollout_group_tokens_heard",
                      "weight_sync_s", "weight_fallbacks", "fleet_recommended", "rollout_logprob_diff_mean",
                      "rollout_logprob_diff_max", "is_ratio_mean", "is_ratio_max", "is_capped_frac"})
"""Fields measured with a clock, following from choices made on measured costs (the draft cap) or
from when the workers' reports arrived (the siblings' tokens relayed between them), or
float rounding that depends on which rows the engine batched together (the behaviour
log-probabilities against the trainer's), beside every `time_*` and `*_per_s`: two runs of one job
legitimately differ in them, in nothing else."""


def deterministic(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row without what is measured with a clock (what two runs of one job must agree on)."""
    return {k: v for k, v in row.items() if not k.startswith("time_") and not k.endswith("_per_s") and k not in MEASURED}


class CapBand(BaseModel):
    """The draft caps of a step's passes over one batch-size band (rhymerl.algorithms.drafting.cap_decisions)."""

    model_config = ConfigDict(extra="forbid")

    passes: int
    drafted: float  # share of the passes that drafted
    cap: float | None  # mean cap of those (None: none drafted)
    reason: str  # the most frequent reason
    reasons: dict[str, int]  # passes per reason


class StepMetrics(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int
    epoch: int
    policy_version: int
    prompts: int
    samples: int
    gen_rounds: int = 1
    time_rollout_s: float
    time_reward_s: float
    time_train_s: float
    rollout_tokens: int
    rollout_tokens_per_s: float
    response_length_mean: float
    response_length_max: int
    reward_mean: float
    reward_failures: int = 0
    zero_std_frac: float
    # training (a step whose batch kept no sample does not train)
    loss: float | None = None
    grad_norm: float | None = None
    pg_clipfrac: float | None = None
    entropy: float | None = None
    kl: float | None = None
    skipped_samples: float | None = None
    skipped_updates: float | None = None
    # speculation
    spec_rate: float = 0.0
    spec_acceptance: float | None = None
    tokens_per_pass: float = 1.0
    spec_sources: dict[str, dict[str, float | None]] | None = None
    """Per draft source: its share of the passes that verified a draft, and its acceptance rate."""
    draft_cap_by_batch: dict[str, CapBand] | None = None
    """Per batch-size band (`1`, `2-3`, `4-7`, ...) whose passes had a draft cap: what they ran under, and why."""
    # the rollout fleet (rows written before 2026-11-26 have them only with several workers, and
    # say rollout_replicas for rollout_workers)
    rollout_workers: int | None = Field(None, validation_alias=AliasChoices("rollout_workers", "rollout_replicas"))
    """Rollout workers that ran calls of the step."""
    rollout_workers_live: int | None = None  # rollout workers in the fleet at the step's end
    rollout_workers_wanted: int | None = None  # rollout workers the job wanted then (spec, `rhymerl scale`)
    rollout_busy_s: list[float] | None = None  # each worker's time working on the step's calls
    rollout_makespan_s: float | None = None  # per round, its start until its last worker finished; summed
    rollout_bubble: float | None = None  # idle share of the workers' time over the makespans
    rollout_migrated: int | None = None  # samples the scheduler moved to another worker, with their tokens
    rollout_stolen: int | None = None  # samples idle workers took over (started ones with their tokens)
    rollout_deferred: int | None = None  # outliers moved on to the next round with their tokens (inter-step)
    rollout_handed_back: int | None = None  # samples of workers that left or died, resumed elsewhere
    rollout_resumed_tokens: int | None = None  # generated tokens the step's calls took over from elsewhere
    rollout_group_tokens_heard: int | None = None  # siblings' tokens relayed between workers (group drafts)
    rollout_drafting_workers: int | None = None  # most workers drafting for others at once (freed drafters)
    rollout_consolidations: int | None = None  # workers emptied onto another to draft for it (freed drafters)
    schedule_ranking: str | None = None  # how the step's first round ranked its prompts (history, prompt-length)
    fleet_recommended: int | None = None  # rollout workers the next step wants (scheduling/fleet_size.py)
    time_step_s: float | None = None  # wall clock of the whole step (before writing its metrics)
    weight_sync_s: float | None = None  # the longest load of the trainer's weights into a rollout worker
    weight_fallbacks: int | None = None  # loads that found no broadcast copy and took the object store's
    # the engine's behaviour log-probabilities against the trainer's (trained samples)
    rollout_logprob_diff_mean: float | None = None  # |trainer - rollout| log-probability, samples of no lag
    rollout_logprob_diff_max: float | None = None
    is_ratio_mean: float | None = None  # importance ratio pi_old / mu per token (off-policy correction)
    is_ratio_max: float | None = None
    is_capped_frac: float | None = None  # share of tokens whose importance weight the cap truncates
    time_wait_rollout_s: float | None = None  # the step loop waiting for rollout results (less when one ran ahead)
    time_wait_train_s: float | None = None  # the step loop waiting for the train worker
    policy_lag_max: int | None = None  # policy versions the step's oldest sample lags behind the trained policy
    history_ok: bool | None = None  # false: some rollout ran without history drafts (history worker unavailable)
    worker_reruns: int | None = None  # rollout or reward calls run again after their worker died

    def row(self) -> dict[str, Any]:
        """The metrics.jsonl row: the fields this step has (RunDir.append_metrics writes it)."""
        return self.model_dump(exclude_unset=True)
