"""The reference runs the Ray scenarios compare against, made once per test process (a session
fixture: every file that asks on one pytest-xdist worker shares it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ray_runs import PIPELINED, TINY, run


@pytest.fixture(scope="session")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny job run in one process (backend: local): what a Ray run at off-policy 0 must equal."""
    out = tmp_path_factory.mktemp("local") / "run"
    res = run(out, TINY)
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="session")
def pipelined(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run at off-policy 1 (what a resumed one must equal)."""
    out = tmp_path_factory.mktemp("pipelined") / "run"
    res = run(out, PIPELINED)
    assert res.returncode == 0, res.stderr
    return out
