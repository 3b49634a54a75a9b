"""The RLJob spec: the one contract read by the CLI, the CRD generator, the operator and every worker.

Every default is defined here, once. Field names follow veRL where a veRL user would look for them
(``clip_ratio_low``, ``loss_agg_mode``, ``kl_coef``, ``top_p``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GROUP = "rhymerl.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"

PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Quantity = Annotated[str | int, Field(description="Kubernetes quantity, e.g. '500m', '2Gi' or 4")]


class Strict(BaseModel):
    """Base for every spec block: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ModelSpec(Strict):
    path: str = Field(
        "builtin:tiny-arith",
        description="'builtin:tiny-arith' (the embedded model) or a directory with config.json, "
        "model.safetensors and tokenizer.json as written by rhymerl",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="compute dtype of the torch engine")


class DataSpec(Strict):
    source: str = Field(
        "builtin:arith-chain",
        description="'builtin:arith-chain' (generated, seeded) or a JSONL file with 'prompt' and 'answer' fields "
        "(optional 'prompt_id')",
    )
    num_prompts: PositiveInt = Field(32, description="prompts generated for a builtin source")
    seed: int = Field(0, description="seed of the builtin generator and of the per-epoch shuffle")
    shuffle: bool = Field(True, description="reshuffle prompt order every epoch")
    min_ops: PositiveInt = Field(8, description="arith-chain: fewest operations in a prompt")
    max_ops: PositiveInt = Field(52, description="arith-chain: most operations in a prompt (<= 52)")
    median_ops: PositiveInt = Field(16, description="arith-chain: median operation count (log-normal tail)")

    @model_validator(mode="after")
    def _ops_ordered(self) -> DataSpec:
        if self.max_ops > 52:
            raise ValueError("max_ops: at most 52 (one label letter per operation)")
        if not self.min_ops <= self.median_ops <= self.max_ops:
            raise ValueError("median_ops: must lie between min_ops and max_ops")
        return self


class DynamicSamplingSpec(Strict):
    enabled: bool = Field(False, description="DAPO dynamic sampling: drop groups whose rewards are all equal")
    max_gen_batches: PositiveInt = Field(3, description="most generation rounds per step to fill the batch")


class OverlongSpec(Strict):
    enabled: bool = Field(False, description="DAPO soft overlong punishment")
    buffer_len: PositiveInt = Field(64, description="tokens before max_response_length where the penalty starts")
    penalty_factor: float = Field(1.0, ge=0.0, description="penalty at max_response_length")


class AlgorithmSpec(Strict):
    name: Literal["grpo", "dapo"] = "grpo"
    group_size: PositiveInt = Field(8, description="responses sampled per prompt (GRPO's G, veRL's rollout.n)")
    prompts_per_step: PositiveInt = Field(8, description="prompts per training step (veRL's train_batch_size)")
    max_response_length: PositiveInt = Field(640, description="tokens generated at most per response")
    epochs: PositiveInt = Field(4, description="passes over the prompt set")
    lr: float = Field(1e-4, gt=0.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0.0)
    clip_ratio_low: float = Field(0.2, ge=0.0, le=1.0, description="PPO clip epsilon below 1")
    clip_ratio_high: float | None = Field(
        None, ge=0.0, description="PPO clip epsilon above 1; default: clip_ratio_low for grpo, 0.28 for dapo"
    )
    kl_coef: float = Field(0.0, ge=0.0, description="weight of the k3 KL penalty to the initial policy")
    entropy_coef: float = Field(0.0, ge=0.0, description="weight of the entropy bonus")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] | None = Field(
        None, description="default: seq-mean-token-mean for grpo, token-mean for dapo"
    )
    norm_adv_by_std: bool = Field(True, description="divide group-relative advantages by the group's std")
    ppo_epochs: PositiveInt = Field(1, description="optimisation passes over each rollout batch")
    mini_batch_size: PositiveInt | None = Field(None, description="responses per optimiser step; default: all")
    max_grad_norm: float = Field(1.0, gt=0.0)
    max_off_policy_steps: NonNegInt = Field(
        1, description="how many policy versions a sample may lag behind (local backend is synchronous: 0 used)"
    )
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


class RewardSpec(Strict):
    verifier: Literal["final-answer"] | None = Field(
        "final-answer", description="built-in verifier: 'final-answer' compares the text after the last '=' "
        "on the response's last line with the answer"
    )
    function: str | None = Field(
        None,
        description="user reward 'module:function', called as fn(prompt: str, response: str, answer: str) -> float",
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
    )
    replicas: PositiveInt = 1

    @model_validator(mode="after")
    def _one_source(self) -> RewardSpec:
        if self.function is not None:
            self.verifier = None
        if self.verifier is None and self.function is None:
            raise ValueError("verifier: set a built-in verifier or a function")
        return self


class SpecWindow(Strict):
    initial: PositiveInt = Field(2, description="AIMD draft window at the start and after a rejection")
    step: PositiveInt = Field(2, description="additive increase after a fully accepted draft")
    max: PositiveInt = Field(32, description="cap of the draft window")

    @model_validator(mode="after")
    def _ordered(self) -> SpecWindow:
        if self.initial > self.max:
            raise ValueError("initial: larger than max")
        return self


class SpecPrefix(Strict):
    """How much of a sequence's context is matched against its history (RhymeRL §5.3 uses 7 -> 3).

    The defaults match longer and fall back further than the paper; `min_prob` keeps the short
    matches from drafting guesses. Measured on the quickstart's rollout (benchmarks/acceptance,
    benchmarks/rollout): more tokens per pass at a higher acceptance rate than 7 -> 3.
    """

    max: PositiveInt = Field(32, description="longest context suffix matched against the history index")
    min: PositiveInt = Field(1, description="shortest suffix tried before giving up on a draft")

    @model_validator(mode="after")
    def _ordered(self) -> SpecPrefix:
        if self.min > self.max:
            raise ValueError("min: larger than max")
        return self


class SpeculationSpec(Strict):
    method: Literal["none", "history", "ngram", "draft-model"] = "history"
    reward_weighted: bool = Field(True, description="history: rank branches by summed reward, not frequency")
    window: SpecWindow = Field(default_factory=SpecWindow)
    prefix: SpecPrefix = Field(default_factory=SpecPrefix)
    min_prob: float = Field(
        0.5, ge=0.0, le=1.0,
        description="history: end a draft before the token whose path probability under the branch priorities "
                    "drops below this (0: follow the best branch to the window, as the paper does)",
    )
    disable_above_batch: PositiveInt | None = Field(
        None, description="switch speculation off above this many running sequences; default: profiled cost model"
    )
    draft_model: str | None = Field(None, description="draft-model: path of the draft model")

    @model_validator(mode="after")
    def _draft_model_named(self) -> SpeculationSpec:
        if self.method == "draft-model" and not self.draft_model:
            raise ValueError("draft_model: required when method is draft-model")
        return self


class Resources(Strict):
    cpu: Quantity = "1"
    memory: Quantity = "2Gi"
    gpu: NonNegInt = 0


class RolloutSpec(Strict):
    engine: Literal["torch", "vllm"] = "torch"
    replicas: PositiveInt = 1
    min_replicas: PositiveInt = 1
    max_replicas: PositiveInt = 1
    gpus_per_replica: NonNegInt = Field(0, description="tensor-parallel GPUs per rollout replica")
    temperature: float = Field(1.0, ge=0.0, description="0 means greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = Field(0, description="sampling seed; a token depends only on (seed, sample id, position, logits)")
    max_batch_size: PositiveInt = Field(256, description="sequences decoded together per replica")
    speculation: SpeculationSpec = Field(default_factory=SpeculationSpec)
    resources: Resources = Field(default_factory=Resources)

    @model_validator(mode="after")
    def _replica_bounds(self) -> RolloutSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas: must be >= min_replicas")
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError("replicas: must lie between min_replicas and max_replicas")
        return self


class MigrationSpec(Strict):
    enabled: bool = True
    tail_fraction: Probability = Field(0.1, description="a group's last fraction of running samples that may migrate")
    growth_percentile: float = Field(75.0, ge=0.0, le=100.0, description="percentile of last epoch's growth rates")
    min_lambda: float = Field(1.1, ge=1.0, description="lower bound of the outlier length factor lambda")
    inter_step: bool = Field(True, description="allow deferring outliers to the next step, tokens preserved")


class SchedulingSpec(Strict):
    policy: Literal["histopipe", "equal", "lpt", "skew-aware", "realloc", "async"] = "histopipe"
    ranking_groups: PositiveInt = Field(8, description="K ranking groups by historical median length")
    two_tier: bool = Field(True, description="tier 2: size each ranking group's worker share by its cost")
    first_epoch: Literal["prompt-length", "random"] = Field(
        "prompt-length", description="ranking without history: by prompt length, or a seeded shuffle"
    )
    migration: MigrationSpec = Field(default_factory=MigrationSpec)
    max_staleness: NonNegInt = Field(1, description="async: policy versions a sample may lag")


class RoleSpec(Strict):
    replicas: PositiveInt = 1
    resources: Resources = Field(default_factory=Resources)


class HistorySpec(RoleSpec):
    store: Literal["memory", "redis"] = "memory"
    redis_url: str | None = Field(None, description="redis://host:port/db; required when store is redis")

    @model_validator(mode="after")
    def _redis_url(self) -> HistorySpec:
        if self.store == "redis" and not self.redis_url:
            raise ValueError("redis_url: required when store is redis")
        return self


class CheckpointSpec(Strict):
    every_steps: PositiveInt = Field(1, description="save model, optimiser and loop state every N steps")
    keep_last: PositiveInt = Field(2, description="checkpoints kept on disk")


class ImagesSpec(Strict):
    controller: str = "ghcr.io/rhymerl/worker-cpu:0.1.0"
    rollout: str = "ghcr.io/rhymerl/worker-gpu:0.1.0"
    train: str = "ghcr.io/rhymerl/worker-gpu:0.1.0"
    reward: str = "ghcr.io/rhymerl/worker-cpu:0.1.0"
    history: str = "ghcr.io/rhymerl/worker-cpu:0.1.0"
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"


class RLJobSpec(Strict):
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    reward: RewardSpec = Field(default_factory=RewardSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    train: RoleSpec = Field(default_factory=RoleSpec)
    history: HistorySpec = Field(default_factory=HistorySpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    images: ImagesSpec = Field(default_factory=ImagesSpec)


class Metadata(Strict):
    name: str = Field(
        "rljob", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=52, description="DNS-1123 label"
    )
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class RLJob(Strict):
    """The whole object as written in YAML; `spec` is what the CRD schema describes."""

    apiVersion: Literal["rhymerl.io/v1alpha1"] = "rhymerl.io/v1alpha1"
    kind: Literal["RLJob"] = "RLJob"
    metadata: Metadata = Field(default_factory=Metadata)
    spec: RLJobSpec = Field(default_factory=RLJobSpec)


class RolloutStatus(BaseModel):
    replicas: NonNegInt = 0
    readyReplicas: NonNegInt = 0
    selector: str = ""


class Condition(BaseModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    lastTransitionTime: str = ""


class RLJobStatus(BaseModel):
    """Written by the operator (or the local runner's summary); never by users."""

    phase: Literal["Pending", "Running", "Succeeded", "Failed"] = "Pending"
    step: NonNegInt = 0
    epoch: NonNegInt = 0
    policyVersion: NonNegInt = 0
    rewardMean: float | None = None
    acceptanceRate: float | None = None
    rollout: RolloutStatus = Field(default_factory=RolloutStatus)
    conditions: list[Condition] = Field(default_factory=list)
