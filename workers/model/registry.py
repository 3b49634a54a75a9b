"""Resolve a ModelSpec to weights and tokenizer: the embedded default or a rhymerl model folder."""

from __future__ import annotations

import torch

from rhymerl.api.spec import ModelSpec
from rhymerl.workers.model.folder import model_dir
from rhymerl.workers.model.tokenizer import CharTokenizer
from rhymerl.workers.model.transformer import TinyLlama, load_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(spec: ModelSpec, device: str = "cpu") -> tuple[TinyLlama, CharTokenizer]:
    folder = model_dir(spec.path)
    model = load_model(folder, DTYPES[spec.dtype], device)
    return model, CharTokenizer.load(folder / "tokenizer.json")
