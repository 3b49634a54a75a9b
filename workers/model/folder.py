"""Where a model lives and what its config.json says, read without importing torch.

Checks that run before a job starts (`rhymerl validate`, `rhymerl run`) need the model's context
length and tokenizer but not its weights; keeping this torch-free keeps them fast. Every problem
with a model folder is a ModelError naming the file at fault.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path

from rhymerl.workers.model.errors import ModelError as ModelError  # re-exported: its old home

BUILTIN = {"builtin:tiny-arith": "tiny-arith", "builtin:tiny-arith-draft": "tiny-arith-draft"}
REBUILD = {"builtin:tiny-arith": "--out {folder}", "builtin:tiny-arith-draft": "--draft --out {folder}"}
"""How `rhymerl pretrain` rebuilds each embedded model."""
CONFIG = "config.json"


FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
"""model_type -> architecture of the families the native model holds (one decoder, their differences as
options: grouped-query attention, projection biases, an untied output layer, Llama 3's RoPE scaling)."""


@dataclass(frozen=True)
class Llama3Rope:
    """Llama 3's RoPE scaling (rope_type "llama3"): long wavelengths slowed by `factor`, short ones kept,
    a smooth ramp between (transformers' `_compute_llama3_parameters`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """What the native decoder reads of a config.json. `source` is the config.json it was read from
    (empty for a model built in code): a folder the native model writes keeps the keys it does not read
    (token ids, the model's own names), under the values of the fields here."""

    vocab_size: int = 128
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 352
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    num_key_value_heads: int | None = None
    explicit_head_dim: int | None = None
    model_type: str = "llama"
    tie_word_embeddings: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    rope_scaling: Llama3Rope | None = None
    source: str = field(default="", repr=False, compare=False)

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    def to_json(self) -> str:
        kept = json.loads(self.source) if self.source else {}
        shape = {f.name: getattr(self, f.name) for f in fields(self) if f.name in SHAPE}
        extra: dict[str, object] = {}
        if self.kv_heads != self.num_attention_heads:
            extra["num_key_value_heads"] = self.kv_heads
        if self.explicit_head_dim is not None:
            extra["head_dim"] = self.explicit_head_dim
        if self.o_bias:  # Llama's attention_bias biases all four projections (Qwen2's q/k/v go by its model_type)
            extra["attention_bias"] = True
        if self.mlp_bias:
            extra["mlp_bias"] = True
        if self.rope_scaling is not None:
            extra["rope_scaling"] = {"rope_type": "llama3", **asdict(self.rope_scaling)}
        if isinstance(kept.get("rope_parameters"), dict):  # transformers 5's place for rope_theta
            kept["rope_parameters"]["rope_theta"] = self.rope_theta
        return json.dumps({**kept, "architectures": [FAMILIES.get(self.model_type, "LlamaForCausalLM")],
                           "model_type": self.model_type, "tie_word_embeddings": self.tie_word_embeddings,
                           **shape, **extra}, indent=2)

    @classmethod
    def from_data(cls, data: object, source: str = "") -> ModelConfig:
        """Read config.json's parsed content; raises ValueError saying which key is wrong. Reads every
        family's config (preflight needs any model's context length); `native_problem` says whether the
        native decoder can hold it."""
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        values: dict[str, object] = {name: _positive(data, name, kind) for name, kind in SHAPE.items() if name in data}
        rope = data.get("rope_parameters")
        if isinstance(rope, dict) and "rope_theta" in rope:  # transformers 5 keeps rope_theta here
            values["rope_theta"] = _positive(rope, "rope_theta", "number")
        for name, key in (("num_key_value_heads", "num_key_value_heads"), ("explicit_head_dim", "head_dim")):
            if data.get(key) is not None:
                values[name] = _positive(data, key, "integer")
        kind = data.get("model_type", "llama")
        attention_bias = data.get("attention_bias") is True
        cfg = cls(**values, model_type=str(kind),  # type: ignore[arg-type]
                  tie_word_embeddings=data.get("tie_word_embeddings", "model_type" not in data) is True,
                  qkv_bias=attention_bias or kind == "qwen2", o_bias=attention_bias,
                  mlp_bias=data.get("mlp_bias") is True, rope_scaling=_llama3_rope(rope_scaling(data)),
                  source=source)
        if cfg.num_attention_heads % cfg.kv_heads or cfg.head_dim % 2:
            raise ValueError(f"num_attention_heads: {cfg.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads ({cfg.kv_heads}), or the head size {cfg.head_dim} is odd")
        if cfg.explicit_head_dim is None and cfg.hidden_size % cfg.num_attention_heads:
            raise ValueError(f"hidden_size: {cfg.hidden_size} is not a multiple of num_attention_heads "
                             f"({cfg.num_attention_heads})")
        return cfg


SHAPE = {"vocab_size": "integer", "hidden_size": "integer", "num_hidden_layers": "integer",
         "num_attention_heads": "integer", "intermediate_size": "integer", "max_position_embeddings": "integer",
         "rope_theta": "number", "rms_norm_eps": "number"}


def _positive(data: dict[str, object], key: str, kind: str) -> int | float:
    value = data[key]
    ok = isinstance(value, int) if kind == "integer" else isinstance(value, int | float)
    if isinstance(value, bool) or not ok or not value > 0 or value == float("inf"):  # type: ignore[operator]
        raise ValueError(f"{key}: {value!r} is not a positive {kind}")
    return value  # type: ignore[return-value]


def rope_scaling(data: dict[str, object]) -> dict[str, object] | None:
    """The RoPE scaling a config asks for (transformers 4's rope_scaling or 5's rope_parameters), None
    for plain RoPE."""
    scaling = data.get("rope_scaling") or data.get("rope_parameters")
    if not isinstance(scaling, dict):
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return None if kind == "default" else scaling


def _llama3_rope(scaling: dict[str, object] | None) -> Llama3Rope | None:
    if scaling is None or scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    try:
        return Llama3Rope(float(scaling["factor"]), float(scaling["low_freq_factor"]),  # type: ignore[arg-type]
                          float(scaling["high_freq_factor"]),  # type: ignore[arg-type]
                          int(scaling["original_max_position_embeddings"]))  # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError):
        raise ValueError("rope_scaling: a llama3 scaling needs factor, low_freq_factor, high_freq_factor and "
                         "original_max_position_embeddings") from None


def read_json(path: Path, missing: str = "") -> object:
    """A JSON file of a model folder; every way it can be unreadable is a ModelError naming it
    (`missing` is added to the message for an absent file)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path.parent}: missing {path.name}{missing}") from None
    except OSError as exc:
        raise ModelError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ModelError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None


def read_config(folder: Path) -> ModelConfig:
    path = folder / CONFIG
    data = read_json(path, "; is this a rhymerl model folder?")
    try:
        return ModelConfig.from_data(data, json.dumps(data, indent=2))
    except ValueError as exc:
        raise ModelError(f"{path}: {exc}") from None


def native_problem(data: dict[str, object]) -> str | None:
    """Why a config.json describes a model rhymerl's native decoder cannot hold (None: it can)."""
    kind = data.get("model_type", "llama")
    scaling = rope_scaling(data)
    scaled = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    sliding = kind == "mistral" or data.get("use_sliding_window") is True
    window = data.get("sliding_window") if sliding else None
    layer_types = data.get("layer_types")
    checks = [
        (kind in FAMILIES, f"model_type is {kind!r}; it holds {', '.join(FAMILIES)}"),
        (data.get("hidden_act", "silu") == "silu", f"hidden_act is {data.get('hidden_act')!r}"),
        (scaled in (None, "llama3"), f"its RoPE scaling is {scaled!r}; it holds llama3's"),
        (window is None, f"it uses sliding-window attention (sliding_window {window})"),
        (not isinstance(layer_types, list) or all(t == "full_attention" for t in layer_types),
         "not every layer is full attention (layer_types)"),
    ]
    return next((why for ok, why in checks if not ok), None)


def check_native(folder: Path) -> None:
    """Refuse, naming config.json, a model that only model.implementation transformers can hold."""
    path = folder / CONFIG
    data = read_json(path, "; is this a model folder?")
    why = native_problem(data) if isinstance(data, dict) else "it is not a JSON object"
    if why is not None:
        raise ModelError(f"{path}: rhymerl's native model cannot hold this model ({why}); set "
                         "model.implementation: transformers (with rollout.engine: vllm)")


def model_dir(path: str, field: str = "model.path") -> Path:
    """The folder of a model path (`field` names it in errors): the embedded model's, a downloaded
    builtin's or a GGUF file's import (made once, cached), or the path itself."""
    from rhymerl.workers.model import gguf_import, packaged_models  # they import this module's ModelError

    if path in BUILTIN:
        folder = Path(str(resources.files("rhymerl").joinpath("assets", BUILTIN[path])))
        if not (folder / "model.safetensors").is_file():
            raise ModelError(
                f"{field}: the embedded model is missing at {folder}; rebuild it with "
                f"`rhymerl pretrain {REBUILD[path].format(folder=folder)}`")
        return folder
    if path.startswith("builtin:") and path not in packaged_models.PACKAGES:
        raise ModelError(f"{field}: unknown builtin '{path}' (known: "
                         f"{', '.join([*BUILTIN, *packaged_models.PACKAGES])})")
    try:
        if path in packaged_models.PACKAGES:
            return packaged_models.packaged_folder(path)
        if path.lower().endswith(".gguf"):
            return gguf_import.imported_folder(Path(path))
    except ModelError as exc:
        raise ModelError(f"{field}: {exc}") from None
    folder = Path(path)
    if not folder.is_dir():
        raise ModelError(f"{field}: {path} is not a folder")
    return folder
