"""User reward modules written for a test: into tmp_path, which is put on sys.path (workers get it too)."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

WriteModule = Callable[[str], str]


@pytest.fixture
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WriteModule:
    """Write Python source as a fresh module and return 'module:score' (the source defines `score`)."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))

    def write(source: str) -> str:
        name = f"user_reward_{uuid.uuid4().hex}"
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
        return f"{name}:score"

    return write
