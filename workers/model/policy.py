"""What the trainer and the rollout engines need of a policy model, whichever implementation holds it.

Two implementations: rhymerl's native Llama (transformer.TinyLlama, the torch engine's bit-exact
decoding) and a Hugging Face transformers model (hf_policy.HfPolicy). Both speak Hugging Face
parameter names at their edges, so a checkpoint folder is a Hugging Face model folder and the
weights a trainer publishes load into vLLM, into a torch-engine rollout worker or into a checkpoint alike.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from rhymerl.workers.model.folder import ModelError, read_json

WEIGHTS = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"


class PolicyModel(nn.Module, abc.ABC):
    """`forward(tokens [B, L], at=None) -> logits [B, L, V]` on right-padded sequences (with `at`
    [B, T]: only at those positions, [B, T, V]), plus the weights under Hugging Face names."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Rows of the embedding (may exceed the tokenizer's vocabulary: padded for kernels)."""

    @abc.abstractmethod
    def hf_state_dict(self) -> dict[str, Tensor]:
        """Every weight under its Hugging Face name (a tied output layer under both names)."""

    @abc.abstractmethod
    def load_hf_state_dict(self, tensors: Mapping[str, Tensor]) -> None:
        """Replace the weights in place from Hugging Face-named tensors (what hf_state_dict gives)."""

    @abc.abstractmethod
    def checkpoint_activations(self, on: bool) -> None:
        """When on, a forward pass that records gradients keeps only each decoder layer's input and
        recomputes the layer in the backward pass."""

    @abc.abstractmethod
    def config_json(self) -> str:
        """The config.json of a folder holding this model."""

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def at_positions(hidden: Tensor, at: Tensor) -> Tensor:
    """Rows `at` [B, T] of each sequence's hidden states [B, L, H] -> [B, T, H]. The trainer scores a
    response's tokens only: applying the output layer to those positions alone spares the prompt's
    logits (a [B, L, V] tensor: 3 GB for 16k tokens of a 49k vocabulary in float32)."""
    return hidden.gather(1, at.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))


def save_model(model: PolicyModel, folder: Path, half: bool = False) -> None:
    """config.json and model.safetensors: a Hugging Face folder (without tokenizer) that vLLM,
    transformers and `read_weights` load. Tensors that share storage (a tied output layer) are
    written as separate copies, as safetensors requires."""
    folder.mkdir(parents=True, exist_ok=True)
    save_weights(model.hf_state_dict(), folder / WEIGHTS, torch.bfloat16 if half else torch.float32)
    (folder / "config.json").write_text(model.config_json())


def save_weights(weights: Mapping[str, Tensor], path: Path, dtype: torch.dtype | None = None) -> None:
    """Hugging Face-named tensors as one safetensors file (in `dtype`; None: their own); tensors that
    share storage are written as separate copies, as safetensors requires."""
    seen: set[int] = set()
    tensors = {}
    for name, t in weights.items():
        t = (t.detach() if dtype is None else t.detach().to(dtype)).contiguous()
        if t.data_ptr() in seen:
            t = t.clone()
        seen.add(t.data_ptr())
        tensors[name] = t
    save_file(tensors, str(path), metadata={"format": "pt"})


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The tensors of a model folder: model.safetensors, or the shards its index names."""
    index = folder / SHARD_INDEX
    if not (folder / WEIGHTS).is_file() and index.is_file():
        data = read_json(index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelError(f"{index}: no weight_map of tensor names to shard files")
        files = sorted({folder / v for v in weight_map.values()})
    else:
        files = [folder / WEIGHTS]
    out: dict[str, Tensor] = {}
    for path in files:
        if not path.is_file():
            raise ModelError(f"{folder}: missing {path.name}")
        try:
            out |= load_file(str(path))
        except (OSError, SafetensorError) as exc:
            raise ModelError(f"{path}: not a readable safetensors file ({exc})") from None
    return out


def model_type(folder: Path) -> str:
    data = read_json(folder / "config.json", "; is this a model folder?")
    kind = data.get("model_type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else json.dumps(kind)
