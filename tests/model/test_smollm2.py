"""The real pretrained model behind builtin:smollm2-135m-instruct answers as it should through its
imported folder: its chat template, its weights, its end-of-turn token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")


def test_smollm2_answers_an_addition_through_its_chat_template(smollm2_folder: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(str(smollm2_folder))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2_folder), dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 17 + 25?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = out[0, ids.shape[1]:].tolist()
    # a 135M model's arithmetic is weak: this is what it answers (a reward function has work to do)
    assert tok.decode(answer, skip_special_tokens=True) == "17 + 25 = 32."
    assert answer[-1] in model.generation_config.eos_token_id  # it stops at <|im_end|> on its own
