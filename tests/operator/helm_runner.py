"""The chart rendered by the real helm binary that scripts/setup.sh --dev installs into .tools/bin."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rhymerl"
HELM = REPO / ".tools" / "bin" / "helm"
FULL_VALUES = Path(__file__).resolve().parent / "values-full.yaml"
NAMESPACE = "rhymerl-system"
# name -> extra `helm template` arguments; "full" turns every toggle on
VARIANTS: dict[str, list[str]] = {
    "default": [],
    "full": ["-f", str(FULL_VALUES)],
    "existing-secret": ["--set", "redis.enabled=true", "--set", "redis.auth.existingSecret=team-redis",
                        "--set", "redis.auth.existingSecretPasswordKey=password"],
    "external-redis": ["--set", "operator.redisPasswordSecret.name=ext-redis",
                       "--set", "operator.redisPasswordSecret.key=pw",
                       "--set", "operator.redisPasswordSecret.endpoints={redis.data.svc.cluster.local:6379}"],
}


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    home = Path(os.environ.get("TMPDIR", "/tmp")) / "rhymerl-helm"
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM_CACHE_HOME": str(home / "cache"),
                               "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")})
