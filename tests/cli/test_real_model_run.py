"""A real pretrained chat model through the whole command line: `examples/smollm2-math.yaml` (SmolLM2-135M-
Instruct, word problems as chat messages, the boxed verifier) cut to two tiny GRPO steps, then `rhymerl eval`
on its held-out split. The model is imported once per machine (the `smollm2_folder` fixture)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import rhymerl

from rhymerl.api.inputs import DataSpec
from rhymerl.workers.model.tokenizer import load_tokenizer
from rhymerl.workers.task.prompts import load_prompts, prompt_text, prompt_tokens

TINY = ("data.num_prompts=2", "algorithm.prompts_per_step=1", "algorithm.group_size=2", "algorithm.epochs=1",
        "algorithm.max_response_length=16", "checkpoint.every_steps=2",
        "rollout.speculation.method=none")  # no verify-cost profile to time: the drafts on SmolLM2 are test_real_model_drafts's


def test_two_grpo_steps_of_smollm2_on_chat_prompts_then_eval_on_the_heldout_split(
        repo: Path, tmp_path: Path, smollm2_folder: Path) -> None:
    out = tmp_path / "run"
    sets = [arg for item in TINY for arg in ("--set", item)]
    res = rhymerl("run", str(repo / "examples" / "smollm2-math.yaml"), "--out", str(out), *sets)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["samples"] == 2 and 0.0 <= r["reward_mean"] <= 1.0 for r in rows)
    # the rollouts answer the problems as the chat template put them: system, worked example, question
    tok = load_tokenizer(smollm2_folder)
    prompts = {p.prompt_id: p for p in load_prompts(DataSpec(source="builtin:word-problems", num_prompts=2))}
    dumped = [json.loads(line) for step in (1, 2)
              for line in (out / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()]
    assert sorted({d["prompt_id"] for d in dumped}) == sorted(prompts)
    for d in dumped:
        prompt = prompts[d["prompt_id"]]
        text = prompt_text(tok, prompt)
        assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
        assert d["prompt_ids"] == prompt_tokens(tok, prompt) == tok.encode(text)
        assert prompt.text in tok.decode(d["prompt_ids"])
    assert (out / "checkpoints" / "step_000002" / "model.safetensors").is_file()
    evaluated = tmp_path / "eval"
    res = rhymerl("eval", str(out), "--set", "data.split=heldout", "--set", "data.num_prompts=2", "--samples", "1",
                  "--checkpoints", "initial,last", "--out", str(evaluated))
    assert res.returncode == 0, res.stderr
    scores = json.loads((evaluated / "results.json").read_text())
    assert [(r["policy"], r["step"]) for r in scores] == [("initial", 0), ("step 2", 2)]
    assert all(0.0 <= r["pass_at_1"] <= 1.0 and 0 < r["mean_length"] <= 16 for r in scores)
