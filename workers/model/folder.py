"""Where a model lives and what its config.json says, read without importing torch.

Checks that run before a job starts (`rhymerl validate`, `rhymerl run`) need the model's context
length and tokenizer but not its weights; keeping this torch-free keeps them fast. Every problem
with a model folder is a ModelError naming the file at fault.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path

from rhymerl.errors import UserError

BUILTIN = {"builtin:tiny-arith": "tiny-arith", "builtin:tiny-arith-draft": "tiny-arith-draft"}
REBUILD = {"builtin:tiny-arith": "--out {folder}", "builtin:tiny-arith-draft": "--draft --out {folder}"}
"""How `rhymerl pretrain` rebuilds each embedded model."""
CONFIG = "config.json"


class ModelError(UserError):
    """A model folder that cannot be used; the message names the file."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 128
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 352
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_json(self) -> str:
        return json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                           "tie_word_embeddings": True, **asdict(self)}, indent=2)

    @classmethod
    def from_data(cls, data: object) -> ModelConfig:
        """Read config.json's parsed content; raises ValueError saying which key is wrong."""
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        values: dict[str, int | float] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            ok = isinstance(value, int) if f.type == "int" else isinstance(value, int | float)
            if isinstance(value, bool) or not ok or not value > 0 or value == float("inf"):
                raise ValueError(f"{f.name}: {value!r} is not a positive {'integer' if f.type == 'int' else 'number'}")
            values[f.name] = value
        cfg = cls(**values)  # type: ignore[arg-type]
        if cfg.hidden_size % cfg.num_attention_heads or cfg.head_dim % 2:
            raise ValueError(f"hidden_size: {cfg.hidden_size} is not num_attention_heads ({cfg.num_attention_heads}) "
                             "times an even head size")
        return cfg


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
        return ModelConfig.from_data(data)
    except ValueError as exc:
        raise ModelError(f"{path}: {exc}") from None


def native_problem(data: dict[str, object]) -> str | None:
    """Why a config.json describes a model rhymerl's native Llama cannot hold (None: it can)."""
    heads = data.get("num_attention_heads")
    hidden = data.get("hidden_size")
    checks = [
        (data.get("model_type", "llama") == "llama", f"model_type is {data.get('model_type')!r}"),
        (data.get("num_key_value_heads", heads) == heads, "it uses grouped-query attention (num_key_value_heads "
         f"{data.get('num_key_value_heads')} < num_attention_heads {heads})"),
        # a config without model_type is rhymerl's own older format, tied by construction
        (data.get("tie_word_embeddings", "model_type" not in data) is True,
         "its output layer is not tied to the embedding"),
        (not data.get("attention_bias") and not data.get("mlp_bias"), "its projections have biases"),
        (data.get("hidden_act", "silu") == "silu", f"hidden_act is {data.get('hidden_act')!r}"),
        (data.get("rope_scaling") is None, "it scales RoPE (rope_scaling)"),
        (isinstance(hidden, int) and isinstance(heads, int) and heads > 0
         and data.get("head_dim", hidden // heads) == hidden // heads, "its head_dim is not hidden_size / heads"),
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
    """The folder of a model path (`field` names it in errors): the embedded model's or the path itself."""
    if path in BUILTIN:
        folder = Path(str(resources.files("rhymerl").joinpath("assets", BUILTIN[path])))
        if not (folder / "model.safetensors").is_file():
            raise ModelError(
                f"{field}: the embedded model is missing at {folder}; rebuild it with "
                f"`rhymerl pretrain {REBUILD[path].format(folder=folder)}`")
        return folder
    if path.startswith("builtin:"):
        raise ModelError(f"{field}: unknown builtin '{path}' (known: {', '.join(BUILTIN)})")
    folder = Path(path)
    if not folder.is_dir():
        raise ModelError(f"{field}: {path} is not a folder")
    return folder
