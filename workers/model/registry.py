"""Resolve a ModelSpec to weights and tokenizer: the embedded default or a rhymerl model folder."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch

from rhymerl.api.spec import ModelSpec
from rhymerl.workers.model.tokenizer import CharTokenizer
from rhymerl.workers.model.transformer import TinyLlama, load_model

BUILTIN = {"builtin:tiny-arith": "tiny-arith"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_dir(path: str) -> Path:
    if path in BUILTIN:
        folder = Path(str(resources.files("rhymerl").joinpath("assets", BUILTIN[path])))
        if not (folder / "model.safetensors").is_file():
            raise FileNotFoundError(
                f"model.path: the embedded model is missing at {folder}; rebuild it with "
                f"`python -P -m rhymerl.workers.model.pretrain --out {folder}`")
        return folder
    if path.startswith("builtin:"):
        raise ValueError(f"model.path: unknown builtin '{path}' (known: {', '.join(BUILTIN)})")
    return Path(path)


def load_policy(spec: ModelSpec, device: str = "cpu") -> tuple[TinyLlama, CharTokenizer]:
    folder = model_dir(spec.path)
    model = load_model(folder, DTYPES[spec.dtype], device)
    return model, CharTokenizer.load(folder / "tokenizer.json")
