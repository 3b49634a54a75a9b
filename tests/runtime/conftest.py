"""The reference runs the Ray scenarios compare against, made once per pytest run: by the first
pytest-xdist worker that asks for one, while any other that asks waits for it and reads the same
folder (a lock in the folder the workers' temporary folders share)."""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

import pytest
from ray_runs import PIPELINED, TINY, run


def _made_once(tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str, sets: list[str]) -> Path:
    shared = tmp_path_factory.mktemp(name) if worker_id == "master" else tmp_path_factory.getbasetemp().parent / name
    shared.mkdir(exist_ok=True)
    out, done = shared / "run", shared / "done"
    with (shared / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes, or as its holder dies
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)  # what a worker that failed making it left
            res = run(out, sets)
            assert res.returncode == 0, res.stderr
            done.touch()
    return out


@pytest.fixture(scope="session")
def in_process(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The tiny job run in one process (backend: local): what a Ray run at off-policy 0 must equal."""
    return _made_once(tmp_path_factory, worker_id, "local", TINY)


@pytest.fixture(scope="session")
def pipelined(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """An uninterrupted run at off-policy 1 (what a resumed one must equal)."""
    return _made_once(tmp_path_factory, worker_id, "pipelined", PIPELINED)
