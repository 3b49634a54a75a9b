"""What one step did, typed: the loop makes it, metrics.jsonl stores it (one line per step,
docs/formats.md), the console, the plots and the RLJob status read it.

Fields that only some steps have (training statistics of a step that trained, the replicas' schedule
when `rollout.replicas` > 1, the counts of `on_nonfinite: skip`) are left unset otherwise and then
absent from the line, as they always were.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


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
    # the replicas' schedule (rollout.replicas > 1)
    rollout_replicas: int | None = None
    rollout_busy_s: list[float] | None = None
    rollout_makespan_s: float | None = None
    rollout_bubble: float | None = None
    rollout_migrated: int | None = None
    rollout_stolen: int | None = None
    schedule_ranking: str | None = None
    time_step_s: float | None = None  # wall clock of the whole step (before writing its metrics)
    # the vLLM engine (rollout.engine vllm)
    rollout_logprob_diff_mean: float | None = None  # |trainer - vLLM| log-probability of the step's tokens
    rollout_logprob_diff_max: float | None = None
    weight_sync_s: float | None = None  # loading the trainer's weights into vLLM before the step
    # the distributed runtime (backend ray)
    time_wait_rollout_s: float | None = None  # the controller waiting for rollout results (less when pipelined)
    time_wait_train_s: float | None = None  # the controller waiting for the train worker
    policy_lag_max: int | None = None  # policy versions the step's oldest sample lags behind the trained policy
    history_ok: bool | None = None  # false: some rollout ran without history drafts (history worker unavailable)
    worker_reruns: int | None = None  # rollout or reward calls run again after their worker died
    rollout_deferred: int | None = None  # outliers moved on to the next round with their tokens (inter-step)
    rollout_resumed_tokens: int | None = None  # generated tokens calls took over (re-runs, work stealing)

    def row(self) -> dict[str, Any]:
        """The metrics.jsonl row: the fields this step has (RunDir.append_metrics writes it)."""
        return self.model_dump(exclude_unset=True)
