"""The one folder this machine's caches live under (``$RHYMERL_CACHE``, default ``~/.cache/rhymerl``):
measured verify-cost profiles, imported GGUF models and downloaded builtin models each keep a subfolder."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("RHYMERL_CACHE") or Path.home() / ".cache" / "rhymerl")
