"""The installed `rhymerl` console script, run from a neutral directory, as a user would."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(sys.executable).parent / "rhymerl"


def rhymerl(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-P", "-m", "rhymerl.cli.main"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=600)
