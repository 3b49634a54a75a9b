"""Hugging Face models end to end: a Llama and a Qwen2 folder (grouped-query attention; Qwen2 with
biases and a tied output layer) trained by transformers and rolled out by vLLM with HistoSpec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from hf_models import write_model
from jobs import job_yaml

from rhymerl.workers.model.policy import read_weights

pytestmark = pytest.mark.slow

# rewards the share of sevens in a response: a random model's responses get rewards that vary within
# a group, something to learn
REWARD = "def score(prompt, response, answer):\n    return response.count('7') / max(len(response), 1)\n"


# greedy twice on one engine, the second time with the first time's responses as history
DRAFTS = """
import json, sys
from pathlib import Path
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.workers.model.tokenizer import load_tokenizer
from rhymerl.workers.rollout.generation import GenRequest, SamplingParams
from rhymerl.workers.rollout.vllm_engine import VllmEngine, VllmSettings

if __name__ == "__main__":
    folder = Path(sys.argv[1])
    tok = load_tokenizer(folder)
    prompts = [tok.prompt_ids(text) for text in ("1+2=", "7*3-1=", "9-4+4=")]
    engine = VllmEngine(VllmSettings(folder, max_batch_size=16, max_model_len=48))
    reqs = [GenRequest(p, i, str(i)) for i, p in enumerate(prompts)]
    params = SamplingParams(0.0, 1.0, 0, 40)
    engine.set_history(prompts, [None] * len(prompts))
    first = engine.generate(reqs, params, tok.eos_id)
    engine.set_history(prompts, [HistoryIndex.build([(r.response_ids, 1.0)]) for r in first])
    second = engine.generate(reqs, params, tok.eos_id)
    print(json.dumps({"same": [a.response_ids == b.response_ids for a, b in zip(first, second)],
                      "drafted": [r.drafted for r in second], "accepted": [r.accepted for r in second],
                      "lengths": [len(r.response_ids) for r in second], "bos": prompts[0][0]}))
    engine.close()
"""


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_history_drafts_of_a_hugging_face_models_own_responses_are_all_accepted(family: str, tmp_path: Path) -> None:
    model = write_model(tmp_path / family, family)
    (tmp_path / "drafts.py").write_text(DRAFTS)
    res = subprocess.run([sys.executable, "-P", str(tmp_path / "drafts.py"), str(model)], capture_output=True,
                         text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert all(got["same"])  # greedy: the drafts change nothing
    # every row drafted its own earlier response and had it accepted; only a last draft running past
    # the 40-token limit is cut short (the proposer drafts up to vLLM's context, not the request's limit)
    for drafted, accepted, length in zip(got["drafted"], got["accepted"], got["lengths"], strict=True):
        assert accepted > length / 2 and (accepted == drafted or length == 40), got
    assert (got["bos"] == 1) == (family == "llama")  # Qwen2's prompts start with the text itself


# greedy once without an end token, then with the token the first response wrote at position 5
# named an end token by generation_config.json (as an instruct model's end of turn is)
STOPS = """
import json, sys
from pathlib import Path
from rhymerl.workers.model.tokenizer import load_tokenizer
from rhymerl.workers.rollout.generation import GenRequest, SamplingParams
from rhymerl.workers.rollout.vllm_engine import VllmEngine, VllmSettings

if __name__ == "__main__":
    folder = Path(sys.argv[1])
    tok = load_tokenizer(folder)
    engine = VllmEngine(VllmSettings(folder, method="none", max_batch_size=4, max_model_len=48))
    reqs = [GenRequest(tok.prompt_ids("1+2="), 0)]
    params = SamplingParams(0.0, 1.0, 0, 40)
    free = engine.generate(reqs, params, -1)[0].response_ids
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [tok.eos_id, free[5]]}))
    stopped = engine.generate(reqs, params, load_tokenizer(folder).stop_ids)[0]
    print(json.dumps({"free": free, "stopped": stopped.response_ids, "reason": stopped.finish_reason}))
    engine.close()
"""


def test_every_end_token_of_the_model_ends_a_vllm_response(tmp_path: Path) -> None:
    model = write_model(tmp_path / "qwen2", "qwen2")
    (tmp_path / "stops.py").write_text(STOPS)
    res = subprocess.run([sys.executable, "-P", str(tmp_path / "stops.py"), str(model)], capture_output=True,
                         text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    end = got["free"].index(got["free"][5])  # its first occurrence
    assert got["stopped"] == got["free"][: end + 1] and got["reason"] == "stop"


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_hugging_face_model_trains_with_transformers_and_rolls_out_on_vllm_in_sync(
        family: str, tmp_path: Path) -> None:
    model = write_model(tmp_path / family, family)
    (tmp_path / "sevens.py").write_text(REWARD)
    (tmp_path / "job.yaml").write_text(job_yaml(
        f"model.path={model}", "model.implementation=transformers", "algorithm.group_size=4",
        "algorithm.max_response_length=24", "rollout.engine=vllm", "rollout.speculation.method=history",
        "reward.function=sevens:score"))
    out = tmp_path / "run"
    res = subprocess.run([str(Path(sys.executable).with_name("rhymerl")), "run", str(tmp_path / "job.yaml"),
                          "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # vLLM sampled with exactly the trainer's weights at every step (float rounding only)
    assert all(r["rollout_logprob_diff_max"] < 1e-3 for r in rows)
    assert all(r["weight_sync_s"] > 0 for r in rows[1:])
    trained = read_weights(sorted((out / "checkpoints").iterdir())[-1])
    initial = read_weights(model)
    assert trained.keys() >= initial.keys() - {"lm_head.weight"}
    assert any(not torch.equal(trained[k], v) for k, v in initial.items() if k in trained)
