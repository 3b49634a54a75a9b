"""Where a run's loop is (LoopState): the step loop, the train worker and the history workers pass it
between processes, and a checkpoint keeps it as state.json (run_dir.py); a plain record, so reading
it needs no torch."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields


@dataclass
class LoopState:
    """Where the loop is: the last finished step and the next prompt to visit."""

    step: int = 0
    epoch: int = 1
    cursor: int = 0
    policy_version: int = 0

    @classmethod
    def from_json(cls, text: str) -> LoopState:
        data = json.loads(text)
        if not isinstance(data, dict) or set(data) != {f.name for f in fields(cls)} or not all(
                isinstance(v, int) and v >= 0 for v in data.values()):
            raise ValueError(f"expected non-negative integers {[f.name for f in fields(cls)]}")
        return cls(**data)
