"""`rhymerl eval`: a run's policy before training and at its checkpoints, each answering the same draws of
held-out (or any) prompts, scored by the job's reward."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from cli_runner import rhymerl

from rhymerl.api.load import parse_job
from rhymerl.workers.model.registry import load_native_policy
from rhymerl.workers.model.transformer import load_model
from rhymerl.workers.reward.verifiers import final_answer
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, SamplingParams
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.task.prompts import load_prompts


def test_eval_scores_the_initial_policy_and_a_checkpoint_on_the_same_draws(tiny_run: Path, tmp_path: Path) -> None:
    res = rhymerl("eval", str(tiny_run), "--samples", "3", "--checkpoints", "initial,1", "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [(r["policy"], r["step"]) for r in rows] == [("initial", 0), ("step 1", 1)]
    assert (tmp_path / "pass_at_1.png").stat().st_size > 0 and "| step 1 |" in (tmp_path / "table.md").read_text()
    # the reference: every prompt's 3 draws (keys of their own) with each policy's weights, by hand
    job = parse_job((tiny_run / "spec.yaml").read_bytes())
    model, tok = load_native_policy(job.spec.model)
    params = SamplingParams(job.spec.rollout.temperature, 1.0, job.spec.rollout.seed, job.spec.algorithm.max_response_length)
    prompts = load_prompts(job.spec.data)
    for row, policy in zip(rows, (model, load_model(tiny_run / "checkpoints" / "step_000001")), strict=True):
        reqs = [GenRequest(tok.prompt_ids(p.text), sample_key(p.prompt_id, "eval", k)) for p in prompts for k in range(3)]
        with torch.inference_mode():
            out = TorchEngine(policy, tok.stop_ids).generate(reqs, params)
        rewards = [final_answer(tok.decode(r.response_ids), p.answer)
                   for p, r in zip((p for p in prompts for _ in range(3)), out, strict=True)]
        assert row["mean_reward"] == sum(rewards) / len(rewards) == row["pass_at_1"]  # a 0/1 verifier
        assert row["mean_length"] == sum(len(r.response_ids) for r in out) / len(out)


def test_eval_of_a_step_without_a_checkpoint_names_the_ones_there_are(tiny_run: Path) -> None:
    res = rhymerl("eval", str(tiny_run), "--checkpoints", "initial,7")
    assert res.returncode == 2
    assert res.stderr.strip().endswith("has no checkpoint of step 7 (checkpoints: 1, 2)")
