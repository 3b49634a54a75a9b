"""vLLM on a real pretrained model (SmolLM2-135M-Instruct, grouped-query attention, its chat template):
greedy decoding gives the torch engine's tokens, and HistoSpec's drafts of the model's own earlier
responses are accepted inside vLLM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from rhymerl.workers.model.tokenizer import load_tokenizer
from rhymerl.workers.model.transformer import load_model
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = ("What is 17 + 25?", "Mia has 4 boxes of 6 pencils. How many pencils does she have?",
             "Name three colors.")
LENGTH = 24

# greedy on vLLM, once plainly and once with the first responses as history
GREEDY = """
import json, sys
from pathlib import Path
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.workers.rollout.generation import GenRequest, SamplingParams
from rhymerl.workers.rollout.vllm_engine import VllmEngine, VllmSettings

if __name__ == "__main__":
    folder, prompts, eos = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    engine = VllmEngine(VllmSettings(folder, max_batch_size=4, max_model_len=128))
    reqs = [GenRequest(p, i, str(i)) for i, p in enumerate(prompts)]
    params = SamplingParams(0.0, 1.0, 0, int(sys.argv[4]))
    engine.set_history(prompts, [None] * len(prompts))
    first = engine.generate(reqs, params, eos)
    engine.set_history(prompts, [HistoryIndex.build([(r.response_ids, 1.0)]) for r in first])
    second = engine.generate(reqs, params, eos)
    print(json.dumps({"first": [r.response_ids for r in first], "second": [r.response_ids for r in second],
                      "accepted": [r.accepted for r in second]}))
    engine.close()
"""


def test_vllm_greedy_decoding_of_a_real_model_is_the_torch_engines_and_history_drafts_are_accepted(
        smollm2_folder: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(smollm2_folder)
    prompts = [tok.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n") for q in QUESTIONS]
    (tmp_path / "greedy.py").write_text(GREEDY)
    res = subprocess.run([sys.executable, "-P", str(tmp_path / "greedy.py"), str(smollm2_folder), json.dumps(prompts),
                          str(tok.eos_id), str(LENGTH)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    engine = TorchEngine(load_model(smollm2_folder), tok.eos_id, max_batch_size=4)
    ours = engine.generate([GenRequest(p, i, str(i)) for i, p in enumerate(prompts)],
                           SamplingParams(0.0, 1.0, 0, LENGTH))
    assert got["first"] == [r.response_ids for r in ours]
    assert got["second"] == got["first"]  # greedy: drafts change nothing
    # its own responses, drafted and accepted (a response that repeats itself can match its history at
    # the wrong place: not every draft lands)
    assert sum(got["accepted"]) > len(QUESTIONS) * LENGTH // 2, got["accepted"]
    # real text: the two sums run to the length limit, the colours end at the end-of-turn token
    assert [len(r) for r in got["first"]] == [LENGTH, LENGTH, 12]
