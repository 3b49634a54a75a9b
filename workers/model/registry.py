"""Resolve a ModelSpec to the policy and its tokenizer: the native model or a transformers one."""

from __future__ import annotations

import torch

from rhymerl.api.inputs import ModelSpec
from rhymerl.workers.model.folder import model_dir
from rhymerl.workers.model.policy import PolicyModel
from rhymerl.workers.model.tokenizer import Tokenizer, load_tokenizer
from rhymerl.workers.model.transformer import TinyLlama, load_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(spec: ModelSpec, device: str = "cpu") -> tuple[PolicyModel, Tokenizer]:
    folder = model_dir(spec.path)
    tok = load_tokenizer(folder)
    if spec.implementation == "transformers":
        from rhymerl.workers.model.hf_policy import load_hf_policy

        return load_hf_policy(folder, DTYPES[spec.dtype], device), tok
    return load_model(folder, DTYPES[spec.dtype], device), tok


def load_native_policy(spec: ModelSpec, device: str = "cpu") -> tuple[TinyLlama, Tokenizer]:
    """The native model (what the torch engine decodes); a ModelError when the folder holds another."""
    folder = model_dir(spec.path)
    return load_model(folder, DTYPES[spec.dtype], device), load_tokenizer(folder)
