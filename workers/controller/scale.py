"""How many rollout workers a run on one machine wants: `rhymerl scale RUN_DIR --rollout N` writes it
into the run folder and the running step loop follows it (a cluster's controller follows its
RLJob's spec.rollout.replicas instead). Without a request the spec's `rollout.replicas` holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rhymerl.api import RLJob
from rhymerl.errors import UserError
from rhymerl.workers import atomic

SCALE_FILE = "fleet.json"


def request_scale(run_path: Path, job: RLJob, rollout: int) -> None:
    """Ask the run in `run_path` (of `job`) for `rollout` workers, within the spec's bounds."""
    r = job.spec.rollout
    if not r.min_replicas <= rollout <= r.max_replicas:
        raise UserError(f"--rollout {rollout}: the job allows {r.min_replicas} to {r.max_replicas} rollout workers "
                        "(spec.rollout.min_replicas, max_replicas)")
    atomic.write_text(run_path / SCALE_FILE, json.dumps({"rollout": rollout}) + "\n")


class ScaleFile:
    """The wanted count, read again whenever the file changes."""

    def __init__(self, run_path: Path, job: RLJob) -> None:
        self.path = run_path / SCALE_FILE
        self.default = job.spec.rollout.replicas
        self.bounds = (job.spec.rollout.min_replicas, job.spec.rollout.max_replicas)
        self._seen: tuple[int, int] | None = None
        self._value = self.default

    def __call__(self) -> int:
        try:
            st = os.stat(self.path)
        except OSError:
            return self.default
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._seen:
            self._seen = stamp
            try:
                value = int(json.loads(self.path.read_text())["rollout"])
            except (OSError, ValueError, KeyError, TypeError):
                return self._value  # being replaced, or damaged: the last good value holds
            self._value = min(max(value, self.bounds[0]), self.bounds[1])
        return self._value
