"""Shared fixtures: repository paths and a tiny random model for engine and trainer tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rhymerl.workers.model.transformer import ModelConfig, TinyLlama

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def tiny_model() -> TinyLlama:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=256)
    return TinyLlama(cfg).eval()
