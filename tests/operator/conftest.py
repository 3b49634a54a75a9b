"""Fixtures of the operator tests: the helm binary and the chart as it renders (helm_runner.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from helm_runner import CHART, HELM, NAMESPACE, VARIANTS, run_helm  # noqa: E402


@pytest.fixture(scope="session")
def helm() -> Path:
    if not HELM.is_file():
        message = f"{HELM} is missing: `bash scripts/setup.sh --dev` installs helm"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return HELM


@pytest.fixture(scope="session")
def chart(helm: Path) -> dict[str, list[dict[str, Any]]]:
    """`helm template` of the chart for each variant, as a list of objects."""
    out = {}
    for name, args in VARIANTS.items():
        res = run_helm(helm, "template", "rhymerl", str(CHART), "--namespace", NAMESPACE, *args)
        assert res.returncode == 0, f"{name}: {res.stderr}"
        out[name] = [doc for doc in yaml.safe_load_all(res.stdout) if doc]
    return out
