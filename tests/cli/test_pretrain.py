"""`rhymerl pretrain`: the embedded model's SFT (and, with --draft, its draft model's distillation) as a
command, writing a folder the runner can load."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from cli_runner import rhymerl

from rhymerl.tools.pretrain import distill_draft
from rhymerl.tools.pretrain_recipe import DraftConfig
from rhymerl.workers.model.folder import model_dir, read_config
from rhymerl.workers.rollout.draft_model import draft_folder

# one torch thread: the evaluation's decode is hundreds of tiny passes, and on a core shared with another
# test process two threads wait on each other at every op (100+ CPU-s for one evaluation, not 2)
ONE_THREAD = ("--threads", "1")


def test_pretrain_writes_a_loadable_model_and_a_card_with_its_recipe(tmp_path: Path) -> None:
    out = tmp_path / "model"
    res = rhymerl("pretrain", "--out", str(out), "--steps", "2", "--eval-every", "2", "--short-steps", "1",
                  "--max-ops", "3", "--seed", "7", *ONE_THREAD)
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


def test_pretrain_draft_distils_a_smaller_model_of_the_teachers_tokenizer(tmp_path: Path) -> None:
    out = tmp_path / "draft"
    res = rhymerl("pretrain", "--draft", "--out", str(out), "--steps", "2", "--eval-every", "2", "--max-ops", "3",
                  "--batch", "2", "--seed", "7", *ONE_THREAD)
    assert res.returncode == 0, res.stderr
    card = json.loads((out / "pretrain.json").read_text())
    assert (card["draft_of"], card["layers"], card["steps"], card["seed"]) == ("builtin:tiny-arith", 2, 2, 7)
    assert card["command"].startswith("rhymerl pretrain --draft --teacher builtin:tiny-arith --layers 2 --steps 2 ")
    assert 0 < card["history"][-1]["sampled_acceptance"] <= card["teacher_sampled_acceptance"] <= 1
    teacher = model_dir("builtin:tiny-arith")
    assert draft_folder(str(out), teacher) == out  # the policy's vocabulary and tokenizer
    assert read_config(out).num_hidden_layers == 2 < read_config(teacher).num_hidden_layers


def test_draft_distillation_is_a_function_of_its_seed(tmp_path: Path) -> None:
    recipe = DraftConfig(layers=1, steps=1, batch=2, max_ops=2, seed=3, eval_every=1, threads=1)
    was = torch.get_num_threads()
    try:
        for name in ("a", "b"):
            distill_draft(recipe, model_dir("builtin:tiny-arith"), tmp_path / name)
    finally:
        torch.set_num_threads(was)  # this test process's own setting, for the tests after this one
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
