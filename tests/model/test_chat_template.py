"""A model's chat template rendered without transformers, exactly as transformers renders it
(workers/model/chat_template.py), and encoded without a second BOS (task/prompts.prompt_tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rhymerl.workers.model.chat_template import load_chat_template
from rhymerl.workers.model.errors import ModelError
from rhymerl.workers.model.hf_tokenizer import HfTokenizer
from rhymerl.workers.task.prompts import DataError, Prompt, prompt_tokens
from tests.chat_folder import BOS_TEMPLATE, SMOLLM2_TEMPLATE, chat_folder

CHATS = [
    [("user", "What is 2+3?")],
    [("system", "Answer in one word."), ("user", "Capital of France?")],
    [("user", "Hi"), ("assistant", "Hello!"), ("user", "  Add 1 and 1.\n")],
]


@pytest.mark.parametrize("template", [SMOLLM2_TEMPLATE, BOS_TEMPLATE])
@pytest.mark.parametrize("chat", CHATS)
def test_a_template_renders_what_transformers_apply_chat_template_gives(
        tmp_path: Path, template: str, chat: list[tuple[str, str]]) -> None:
    from transformers import AutoTokenizer

    folder = chat_folder(tmp_path / "tok", template)
    ours = load_chat_template(folder)
    assert ours is not None
    theirs = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        [{"role": r, "content": c} for r, c in chat], tokenize=False, add_generation_prompt=True)
    assert ours.render(chat) == theirs


def test_a_rendered_prompt_gets_no_second_bos_while_a_string_prompt_keeps_its_one(tmp_path: Path) -> None:
    tok = HfTokenizer.load(chat_folder(tmp_path / "tok", BOS_TEMPLATE, bos_first=True))
    chat = Prompt("p", "2+3?", "5", messages=(("user", "2+3?"),))
    ids = prompt_tokens(tok, chat)
    assert ids == tok.encode("<|endoftext|>user: 2+3?\nassistant:")
    assert ids.count(0) == 1
    assert prompt_tokens(tok, Prompt("q", "2+3?", "5")) == [0, *tok.encode("2+3?")]


def test_a_list_of_named_templates_gives_the_one_named_default(tmp_path: Path) -> None:
    folder = chat_folder(tmp_path / "tok", [{"name": "tool_use", "template": "TOOLS"},
                                            {"name": "default", "template": SMOLLM2_TEMPLATE}])
    template = load_chat_template(folder)
    assert template is not None
    assert template.render([("system", "s"), ("user", "u")]) == (
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n")


def test_a_chat_template_jinja_file_is_read_before_tokenizer_config(tmp_path: Path) -> None:
    folder = chat_folder(tmp_path / "tok")
    (folder / "chat_template.jinja").write_text("{{ messages[-1]['content'] }}!")
    template = load_chat_template(folder)
    assert template is not None and template.render([("user", "hey")]) == "hey!"


def test_a_list_without_a_default_template_is_refused_naming_the_file(tmp_path: Path) -> None:
    folder = chat_folder(tmp_path / "tok", [{"name": "tool_use", "template": "TOOLS"}])
    with pytest.raises(ModelError, match=r"tokenizer_config.json: chat_template: a list of templates without one "
                                         "named 'default'"):
        load_chat_template(folder)


def test_a_template_that_raises_refuses_the_prompt_with_its_message(tmp_path: Path) -> None:
    tok = HfTokenizer.load(chat_folder(tmp_path / "tok", BOS_TEMPLATE))
    with pytest.raises(DataError, match=r"the chat template of .*tokenizer_config.json refused the messages: no user"):
        prompt_tokens(tok, Prompt("p", "", "5", messages=(("user", ""),)))


def test_a_folder_without_a_template_has_none(tmp_path: Path) -> None:
    folder = chat_folder(tmp_path / "tok", None)
    assert load_chat_template(folder) is None
    assert HfTokenizer.load(folder).chat_template is None


def test_smollm2s_own_template_gives_the_tokens_transformers_gives(smollm2_folder: Path) -> None:
    from transformers import AutoTokenizer

    chat = (("system", "Answer with a number."), ("user", "What is 17 + 25?"))
    tok = HfTokenizer.load(smollm2_folder)
    theirs = AutoTokenizer.from_pretrained(str(smollm2_folder)).apply_chat_template(
        [{"role": r, "content": c} for r, c in chat], tokenize=True, add_generation_prompt=True, return_dict=True)
    assert prompt_tokens(tok, Prompt("p", "What is 17 + 25?", "42", messages=chat)) == theirs["input_ids"]
