"""Data rows as veRL and TRL write them: parquet, arrow folders and chat-message JSONL
(workers/task/rows.py, workers/task/prompts.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rhymerl.api.inputs import DataSpec
from rhymerl.workers.model.hf_tokenizer import HfTokenizer
from rhymerl.workers.model.tokenizer import CharTokenizer
from rhymerl.workers.task.prompts import DataError, Prompt, located_prompts, prompt_text, prompt_tokens
from tests.chat_folder import chat_folder


def verl_row(i: int, question: str, truth: str) -> dict[str, Any]:
    return {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": question}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": "train", "index": i, "answer": f"#### {truth}"}}


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def spec(source: Path, chat_template: str = "auto") -> DataSpec:
    return DataSpec.model_validate({"source": str(source), "chatTemplate": chat_template})


def test_a_verl_parquet_dataset_loads_with_its_ground_truth_index_and_extras(tmp_path: Path) -> None:
    data = write_parquet(tmp_path / "train.parquet", [verl_row(7, "What is 2+3?", "5"), verl_row(9, "4*2?", "8")])
    located = located_prompts(spec(data))
    assert [where for where, _ in located] == [f"{data}: row 1", f"{data}: row 2"]
    first = located[0][1]
    assert (first.prompt_id, first.answer, first.messages) == ("7", "5", (("user", "What is 2+3?"),))
    assert first.reward_extras() == {"data_source": "openai/gsm8k",
                                     "extra_info": {"split": "train", "index": 7, "answer": "#### 5"}}


def test_the_verl_prompt_is_rendered_by_the_models_template(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = chat_folder(tmp_path / "tok")
    data = write_parquet(tmp_path / "train.parquet", [verl_row(0, "What is 2+3?", "5")])
    prompt = located_prompts(spec(data))[0][1]
    tok = HfTokenizer.load(folder)
    expected = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True)
    assert prompt_text(tok, prompt) == expected
    assert prompt_tokens(tok, prompt) == tok.encode(expected)


def test_a_trl_messages_jsonl_drops_the_trailing_assistant_turn(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "trl.jsonl", [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"},
                      {"role": "assistant", "content": "2"}], "answer": "2"},
        {"prompt": "plain 2+2=", "answer": "4", "prompt_id": "p4"},
    ])
    located = located_prompts(spec(data))
    chat, plain = located[0][1], located[1][1]
    assert located[0][0] == f"{data}:1"
    assert chat == Prompt("line-1", "1+1?", "2", messages=(("system", "Be brief."), ("user", "1+1?")))
    assert plain == Prompt("p4", "plain 2+2=", "4")


def test_a_string_prompt_is_encoded_as_before_with_one_bos() -> None:
    tok = CharTokenizer()
    assert prompt_tokens(tok, Prompt("p", "1+2=", "3")) == [tok.bos_id, *tok.encode("1+2=")]


def test_a_save_to_disk_folder_is_read_with_pyarrow_file_by_file(tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    folder.mkdir()
    names = []
    unanswered = verl_row(2, "c?", "3") | {"reward_model": {"style": "rule", "ground_truth": None}}
    for shard, rows in enumerate([[verl_row(0, "a?", "1")], [verl_row(1, "b?", "2"), unanswered]]):
        name = f"data-{shard:05d}-of-00002.arrow"
        table = pa.Table.from_pylist(rows)
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        names.append(name)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names]}))
    (folder / "dataset_info.json").write_text("{}")
    with pytest.raises(DataError) as info:
        located_prompts(spec(folder))
    assert str(info.value) == (f"{folder / names[1]}: row 2: no answer: needs 'answer' or veRL's "
                               "'reward_model.ground_truth' as a string")


def test_a_parquet_row_without_a_prompt_is_refused_naming_its_row(tmp_path: Path) -> None:
    data = write_parquet(tmp_path / "t.parquet", [{"question": "x", "answer": "1"}, {"question": "y", "answer": "2"}])
    with pytest.raises(DataError, match=r"t.parquet: row 1: no prompt: needs 'prompt' \(a string or chat "
                                        r"messages\) or TRL's 'messages'$"):
        located_prompts(spec(data))


@pytest.mark.parametrize(("messages", "problem"), [
    ([{"role": "user"}], r"messages\[0\]: must be an object with string 'role' and 'content'"),
    ([{"role": "robot", "content": "x"}], r"messages\[0\]: role 'robot' is not one of system, user, assistant"),
    ([], r"messages: must be a non-empty list of \{role, content\} messages"),
    ([{"role": "assistant", "content": "x"}], r"messages: only an assistant turn"),
])
def test_a_malformed_messages_row_is_refused_naming_file_line_and_field(
        tmp_path: Path, messages: list[object], problem: str) -> None:
    data = write_jsonl(tmp_path / "m.jsonl", [{"prompt": "ok", "answer": "1"}, {"messages": messages, "answer": "1"}])
    with pytest.raises(DataError, match=r"m.jsonl:2: " + problem):
        located_prompts(spec(data))


def test_chat_template_none_refuses_chat_messages_naming_the_field(tmp_path: Path) -> None:
    data = write_parquet(tmp_path / "t.parquet", [verl_row(0, "a?", "1")])
    with pytest.raises(DataError, match=r"t.parquet: row 1: data.chatTemplate: none, but the row's prompt is chat "
                                        "messages; set data.chatTemplate: auto"):
        located_prompts(spec(data, "none"))


def test_a_model_without_a_template_refuses_chat_messages_naming_the_field() -> None:
    with pytest.raises(DataError, match=r"^data.chatTemplate: auto, but the model has no chat template"):
        prompt_tokens(CharTokenizer(), Prompt("p", "a?", "1", messages=(("user", "a?"),)))


def test_an_index_that_repeats_is_a_duplicate_prompt_id(tmp_path: Path) -> None:
    data = write_parquet(tmp_path / "t.parquet", [verl_row(3, "a?", "1"), verl_row(3, "b?", "2")])
    with pytest.raises(DataError, match=r"t.parquet: row 2: duplicate prompt_id '3'"):
        located_prompts(spec(data))
