"""Prompts checked against the model before a run writes anything (workers/controller/preflight.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from jobs import make_job

from rhymerl.api import SpecError
from rhymerl.workers.controller.preflight import check_memory, kv_cache_bytes, preflight
from rhymerl.workers.model.folder import ModelError, model_dir
from rhymerl.workers.model.transformer import load_model
from rhymerl.workers.task.prompts import DataError

# the spec's defaults but for responses of at most 64 tokens
RESPONSE_64 = "algorithm.max_response_length=64"


def jsonl(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_a_character_outside_the_tokenizer_is_named_with_file_line_and_code_point(tmp_path: Path) -> None:
    data = jsonl(tmp_path, '{"prompt": "1+1?", "answer": "2"}', '{"prompt": "caf\\u00e9 1+1?", "answer": "2"}')
    with pytest.raises(DataError) as info:
        preflight(make_job(f"data.source={data}", RESPONSE_64, base="defaults"))
    assert str(info.value) == (f"{data}:2: prompt: character 'é' (U+00E9) at position 4 is not in the model's "
                               "tokenizer")


def test_an_answer_the_model_cannot_write_is_refused_too(tmp_path: Path) -> None:
    data = jsonl(tmp_path, '{"prompt": "1+1?", "answer": "\\u4e8c"}')
    with pytest.raises(DataError, match=r"data.jsonl:1: answer: character '二' \(U\+4E8C\)"):
        preflight(make_job(f"data.source={data}", RESPONSE_64, base="defaults"))


def test_a_prompt_too_long_for_the_context_is_refused_with_the_numbers(tmp_path: Path) -> None:
    data = jsonl(tmp_path, '{"prompt": "1+1?", "answer": "2"}', '{"prompt": "' + "7" * 1000 + '", "answer": "2"}',
                 '{"prompt": "' + "7" * 2000 + '", "answer": "2"}')
    with pytest.raises(DataError) as info:
        preflight(make_job(f"data.source={data}", RESPONSE_64, base="defaults"))
    assert str(info.value) == (f"{data}:2: prompt is 1001 tokens; with algorithm.max_response_length 64 a sample "
                               "needs 1066 positions and the model has 1024 (and 1 more problem in the prompts)")


def test_a_bad_byte_in_the_data_is_named_by_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"prompt": "1+1?", "answer": "2"}\n{"prompt": "\xff", "answer": "2"}\n')
    with pytest.raises(DataError, match=r"data.jsonl:2: not UTF-8: byte 0xff at column 13$"):
        preflight(make_job(f"data.source={data}", RESPONSE_64, base="defaults"))


def test_a_response_length_that_leaves_no_room_for_a_prompt_names_the_field() -> None:
    with pytest.raises(SpecError) as info:
        preflight(make_job("algorithm.max_response_length=1024", base="defaults"))
    assert info.value.problems[0].path == "spec.algorithm.max_response_length"


def test_the_builtin_prompts_pass_and_report_their_longest_prompt() -> None:
    checked = preflight(make_job(RESPONSE_64, base="defaults"))
    assert checked.config is not None and checked.config.max_position_embeddings == 1024
    assert checked.longest_prompt is not None and 20 < checked.longest_prompt < 1024 - 64
    assert checked.skipped == []


def test_paths_not_on_this_machine_are_noted_when_absence_is_allowed(tmp_path: Path) -> None:
    job = make_job(f"data.source={tmp_path / 'elsewhere.jsonl'}", f"model.path={tmp_path / 'qwen'}", RESPONSE_64,
                   base="defaults")
    checked = preflight(job, absent_ok=True)
    assert checked.skipped == [f"model: {tmp_path / 'qwen'} is not on this machine",
                               f"data: {tmp_path / 'elsewhere.jsonl'} is not on this machine"]
    with pytest.raises(ModelError, match="is not a folder"):
        preflight(job)


def test_a_kv_cache_larger_than_the_machine_is_refused_naming_max_batch_size() -> None:
    job = make_job(RESPONSE_64, "rollout.max_batch_size=4096", base="defaults")
    job.spec.algorithm.group_size, job.spec.algorithm.prompts_per_step = 64, 64
    checked = preflight(job)
    assert checked.config is not None and checked.longest_prompt is not None
    need = kv_cache_bytes(job, checked.config, checked.longest_prompt)
    # 4096 sequences x 4 layers x 4 heads x 32 dims x K and V x 4 bytes, each up to a 16-rounded length
    positions = -(-(checked.longest_prompt + 64 + 1) // 16) * 16
    assert need == 4096 * 4 * 4 * 32 * 2 * 4 * positions
    check_memory(job, checked, memory=need)
    with pytest.raises(SpecError) as info:
        check_memory(job, checked, memory=need - 1)
    assert info.value.problems[0].path == "spec.rollout.max_batch_size"


def test_a_damaged_config_json_is_named_when_the_model_loads(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(model_dir("builtin:tiny-arith"), folder)
    config = folder / "config.json"
    config.write_text(config.read_text()[:40])
    with pytest.raises(ModelError) as info:
        load_model(folder)
    assert str(info.value).startswith(f"{config}:")
    config.write_text('{"hidden_size": 130, "num_attention_heads": 4}')
    with pytest.raises(ModelError, match=r"config\.json: hidden_size: 130 is not a multiple of num_attention_heads \(4\)"):
        load_model(folder)


def test_truncated_weights_are_named_when_the_model_loads(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(model_dir("builtin:tiny-arith"), folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelError, match=f"^{weights}: not a readable safetensors file"):
        load_model(folder)


def _templated_tiny_model(tmp_path: Path) -> Path:
    """The tiny model with a ChatML template added to its tokenizer_config.json."""
    import json

    from tests.chat_folder import SMOLLM2_TEMPLATE

    folder = tmp_path / "templated"
    shutil.copytree(model_dir("builtin:tiny-arith"), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": SMOLLM2_TEMPLATE}))
    return folder


def _verl_parquet(path: Path, questions: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "t", "prompt": [{"role": "user", "content": q}],
             "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {"index": i}}
            for i, q in enumerate(questions)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_chat_prompts_are_measured_as_the_template_renders_them_and_named_by_row(tmp_path: Path) -> None:
    model = _templated_tiny_model(tmp_path)
    data = _verl_parquet(tmp_path / "t.parquet", ["1+1?", "7" * 900])
    rendered = len("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                   "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n") + 900
    with pytest.raises(DataError) as info:
        preflight(make_job(f"data.source={data}", f"model.path={model}", RESPONSE_64, base="defaults"))
    assert str(info.value) == (f"{data}: row 2: prompt is {rendered} tokens; with algorithm.max_response_length 64 a "
                               f"sample needs {rendered + 65} positions and the model has 1024")


def test_chat_prompts_that_fit_pass_with_their_rendered_length(tmp_path: Path) -> None:
    model = _templated_tiny_model(tmp_path)
    data = _verl_parquet(tmp_path / "t.parquet", ["1+1?", "12+30?"])
    checked = preflight(make_job(f"data.source={data}", f"model.path={model}", RESPONSE_64, base="defaults"))
    assert checked.longest_prompt == len("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                                         "Hugging Face<|im_end|>\n<|im_start|>user\n12+30?<|im_end|>\n"
                                         "<|im_start|>assistant\n")


def test_chat_prompts_on_a_model_without_a_template_are_refused_naming_data_chat_template(tmp_path: Path) -> None:
    data = _verl_parquet(tmp_path / "t.parquet", ["1+1?", "2+2?"])
    with pytest.raises(DataError) as info:
        preflight(make_job(f"data.source={data}", RESPONSE_64, base="defaults"))
    assert str(info.value).startswith(f"{data}: row 1: data.chatTemplate: auto, but the model has no chat template")
    assert str(info.value).endswith("(and 1 more problem in the prompts)")
