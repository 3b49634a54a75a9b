"""Data-parallel training on gloo ranks, each its own process: the gradient does not depend on the
number of ranks, and a checkpoint written by one rank count trains on in another."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rhymerl.workers.train.ranks import Ranks, share

RANK_SCRIPT = Path(__file__).with_name("dp_rank.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train(world: int, scenario: str, out: Path, checkpoint: Path | None = None) -> dict[str, Any]:
    port = _free_port()
    extra = [str(checkpoint)] if checkpoint else []
    procs = [subprocess.Popen([sys.executable, str(RANK_SCRIPT), str(r), str(world), str(port), str(out), scenario,
                               *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for rank, (p, text) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"rank {rank} of {world}: {text[-3000:]}"
    result: dict[str, Any] = torch.load(out, weights_only=False)
    return result


def _assert_same_gradient(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["grads"].keys() == b["grads"].keys() and a["grads"]
    for name in a["grads"]:
        assert torch.allclose(a["grads"][name], b["grads"][name], atol=1e-6, rtol=1e-5), name
    for key in ("loss", "entropy", "pg_clipfrac", "is_ratio_mean"):
        assert a["stats"][key] == pytest.approx(b["stats"][key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("scenario", ["single", "ppo", "skip"])
def test_two_and_three_ranks_compute_the_one_rank_gradient(scenario: str, tmp_path: Path) -> None:
    one = _train(1, scenario, tmp_path / "one.pt")
    for world in (2, 3):
        many = _train(world, scenario, tmp_path / f"{world}.pt")
        _assert_same_gradient(one, many)
        assert many["skipped"] == one["skipped"]
    if scenario == "skip":
        assert one["skipped"] == ["sample 3"] and one["stats"]["skipped_samples"] == 1.0


def test_a_checkpoint_of_two_ranks_trains_on_one_and_three_as_one_rank_would(tmp_path: Path) -> None:
    first_one = _train(1, "single", tmp_path / "first1.pt")
    first_two = _train(2, "single", tmp_path / "first2.pt")
    # the full state two ranks gathered is the one-rank optimiser's format, keyed by parameter index
    assert first_two["optimizer"]["state"].keys() == first_one["optimizer"]["state"].keys()
    then_one = _train(1, "single", tmp_path / "then1.pt", tmp_path / "first1.pt")
    for world, path in ((1, "first2.pt"), (3, "first2.pt")):
        resumed = _train(world, "single", tmp_path / f"resumed{world}.pt", tmp_path / path)
        _assert_same_gradient(then_one, resumed)
        for name, w in then_one["weights"].items():
            assert torch.allclose(w, resumed["weights"][name], atol=1e-4), name
    # the restored optimiser moved on: its step count is two updates
    assert all(float(s["step"]) == 2.0 for s in then_one["optimizer"]["state"].values())


def test_rows_are_shared_out_longest_first_to_the_least_loaded_rank() -> None:
    sizes = [10, 9, 8, 3, 2, 1]
    shares = [share(sizes, list(range(6)), Ranks(r, 2)) for r in range(2)]
    # 10 -> rank 0 (10, 0); 9 -> 1 (10, 9); 8 -> 1 (10, 17); 3, 2, 1 -> 0 (16, 17)
    assert shares == [[0, 3, 4, 5], [1, 2]]
    assert sorted(shares[0] + shares[1]) == list(range(6))
    assert share(sizes, [5, 0], Ranks(0, 1)) == [5, 0]
