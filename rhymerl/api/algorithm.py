"""The policy-gradient algorithm: GRPO or DAPO, its loss, optimiser and off-policy settings.

Field names follow veRL where a veRL user would look for them (``clip_ratio_low``, ``loss_agg_mode``,
``kl_coef``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rhymerl.api.blocks import MAX_BATCH, MAX_COEF, MAX_TOKENS, NonNegInt, PositiveInt, Strict


class DynamicSamplingSpec(Strict):
    enabled: bool = Field(False, description="DAPO dynamic sampling: drop groups whose rewards are all equal")
    max_gen_batches: PositiveInt = Field(3, le=64, description="most generation rounds per step to fill the batch "
                                         "(at most 64, each a full rollout)")


class OverlongSpec(Strict):
    enabled: bool = Field(False, description="DAPO soft overlong punishment")
    buffer_len: PositiveInt = Field(64, le=MAX_TOKENS, description="tokens before max_response_length where the "
                                    f"penalty starts (at most {MAX_TOKENS})")
    penalty_factor: float = Field(1.0, ge=0.0, le=MAX_COEF, description="penalty at max_response_length (at most "
                                  f"{MAX_COEF:g})")


class AlgorithmSpec(Strict):
    name: Literal["grpo", "dapo"] = "grpo"
    group_size: PositiveInt = Field(8, le=1024, description="responses sampled per prompt (GRPO's G, veRL's "
                                    "rollout.n; at most 1024)")
    prompts_per_step: PositiveInt = Field(8, le=16_384, description="prompts per training step (veRL's "
                                          "train_batch_size; at most 16384)")
    max_response_length: PositiveInt = Field(640, le=MAX_TOKENS, description="tokens generated at most per response "
                                             f"(at most {MAX_TOKENS}; prompt + response must also fit the model)")
    epochs: PositiveInt = Field(4, le=1000, description="passes over the prompt set (at most 1000)")
    lr: float = Field(1e-4, gt=0.0, le=10.0, description="AdamW learning rate (at most 10)")
    weight_decay: float = Field(0.0, ge=0.0, le=MAX_COEF, description=f"AdamW weight decay (at most {MAX_COEF:g})")
    clip_ratio_low: float = Field(0.2, ge=0.0, le=1.0, description="PPO clip epsilon below 1")
    clip_ratio_high: float | None = Field(
        None, ge=0.0, le=10.0, description="PPO clip epsilon above 1 (at most 10); default: clip_ratio_low for grpo, "
        "0.28 for dapo"
    )
    kl_coef: float = Field(0.0, ge=0.0, le=MAX_COEF, description="weight of the k3 KL penalty to the initial policy "
                           f"(at most {MAX_COEF:g})")
    entropy_coef: float = Field(0.0, ge=0.0, le=MAX_COEF, description=f"weight of the entropy bonus (at most "
                                f"{MAX_COEF:g})")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] | None = Field(
        None, description="default: seq-mean-token-mean for grpo, token-mean for dapo"
    )
    norm_adv_by_std: bool = Field(True, description="divide group-relative advantages by the group's std")
    ppo_epochs: PositiveInt = Field(1, le=100, description="optimisation passes over each rollout batch (at most 100)")
    mini_batch_size: PositiveInt | None = Field(None, le=MAX_BATCH * 1024, description="responses per optimiser "
                                                f"step (at most {MAX_BATCH * 1024}); default: all")
    max_grad_norm: float = Field(1.0, gt=0.0, le=1e12, description="gradient-norm clip (at most 1e12: a huge value "
                                 "turns clipping off)")
    on_nonfinite: Literal["fail", "skip"] = Field(
        "fail", description="a nan or inf reward, advantage, loss or gradient: 'fail' stops the run (exit 2) "
        "naming the step, prompt, sample and value before it reaches the weights; 'skip' scores such a reward as a "
        "reward failure (reward.failure_reward), leaves such a sample out of the update, or skips such an update, "
        "and records it (metrics, events.log)"
    )
    max_off_policy_steps: NonNegInt = Field(
        1, le=64, description="how many policy versions a sample may lag behind, at most 64; the local backend is "
        "synchronous (0 used); the ray backend overlaps the rollout of step n+1 with the training of step n when "
        ">= 1 (a lag of one version)"
    )
    off_policy_correction: Literal["auto", "none", "token", "sequence"] = Field(
        "auto", description="truncated importance sampling (TIS) on the rollout engine's behaviour "
        "log-probabilities: each token's policy-gradient term weighted by min(pi_old / mu, importance_cap), mu the "
        "distribution the token was drawn from (after temperature and top-p); token: a ratio per token, sequence: "
        "the product over the response; auto: token when rollout.engine is vllm or rollout runs ahead of training "
        "(max_off_policy_steps >= 1 on the ray backend or a cluster), else none (the torch engine at off-policy 0 "
        "samples from the trainer's own weights: the ratio is 1)"
    )
    importance_cap: float = Field(2.0, ge=1.0, le=1e4, description="the largest importance weight (TIS's C; "
                                  "veRL's rollout_is_threshold)")
    dynamic_sampling: DynamicSamplingSpec | None = Field(None, description="default: enabled for dapo")
    overlong: OverlongSpec = Field(default_factory=OverlongSpec)

    @model_validator(mode="after")
    def _algorithm_defaults(self) -> AlgorithmSpec:
        dapo = self.name == "dapo"
        if self.clip_ratio_high is None:
            self.clip_ratio_high = 0.28 if dapo else self.clip_ratio_low
        if self.loss_agg_mode is None:
            self.loss_agg_mode = "token-mean" if dapo else "seq-mean-token-mean"
        if self.dynamic_sampling is None:
            self.dynamic_sampling = DynamicSamplingSpec(enabled=dapo)
        if self.group_size < 2:
            raise ValueError("group_size: group-relative advantages need at least 2 responses per prompt")
        if self.mini_batch_size is not None and self.mini_batch_size > self.group_size * self.prompts_per_step:
            raise ValueError("mini_batch_size: larger than the batch (group_size * prompts_per_step)")
        return self
