"""`rhymerl pretrain`: the embedded model's SFT as a command, writing a folder the runner can load."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import rhymerl

from rhymerl.workers.model.folder import read_config


def test_pretrain_writes_a_loadable_model_and_a_card_with_its_recipe(tmp_path: Path) -> None:
    out = tmp_path / "model"
    res = rhymerl("pretrain", "--out", str(out), "--steps", "2", "--eval-every", "2", "--short-steps", "1",
                  "--max-ops", "3", "--seed", "7")
    assert res.returncode == 0, res.stderr
    card = json.loads((out / "pretrain.json").read_text())
    assert (card["steps"], card["seed"], card["max_ops"]) == (2, 7, 3)
    assert [row["step"] for row in card["history"]] == [2]
    assert read_config(out).vocab_size > 0
    assert (out / "model.safetensors").stat().st_size > 0


def test_pretrain_into_a_file_is_refused_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = rhymerl("pretrain", "--out", str(blocker), "--steps", "1")
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: cannot write into {blocker}: it is a file, not a folder"
