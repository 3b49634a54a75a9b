"""Makes the shared command-line runner (cli_runner.py) importable under --import-mode=importlib."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished quickstart run cut down to 4 prompts x 4 samples, 2 steps, one epoch."""
    from cli_runner import rhymerl

    repo = Path(__file__).resolve().parents[2]
    run = tmp_path_factory.mktemp("tiny") / "run"
    res = rhymerl("run", str(repo / "examples" / "quickstart.yaml"), "--out", str(run),
                  "--set", "data.num_prompts=4", "--set", "algorithm.prompts_per_step=2",
                  "--set", "algorithm.group_size=4", "--set", "algorithm.epochs=1",
                  "--set", "algorithm.max_response_length=96")
    assert res.returncode == 0, res.stderr
    return run
