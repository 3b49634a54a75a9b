"""A model's chat template, rendered the way transformers' `apply_chat_template` renders it.

Preflight and the rollout workers turn chat messages into the text the model was tuned on without
importing transformers (and torch): the template is read from the model folder
(`chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`) and rendered with jinja2 in
transformers' environment (sandboxed, trim_blocks, lstrip_blocks, `raise_exception`, a `tojson` that
does not escape HTML, `strftime_now`), with the tokenizer's special tokens (bos_token, eos_token, ...) as variables.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from rhymerl.workers.model.errors import ModelError
from rhymerl.workers.model.folder import read_json

SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
"""The special tokens transformers hands a template as variables (its special_tokens_map)."""

Message = tuple[str, str]
"""(role, content) of one chat message."""


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """One compiled template; `render` gives the prompt text with the generation prompt added."""

    def __init__(self, source: str, where: str, specials: dict[str, str]) -> None:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                           extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.where = where
        self.specials = specials
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ModelError(f"{where}: the chat template does not compile: {exc}") from None

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt for `messages` (add_generation_prompt true); ValueError says why the template refused them."""
        import jinja2

        chat: list[dict[str, Any]] = [{"role": role, "content": content} for role, content in messages]
        try:
            return str(self._template.render(messages=chat, tools=None, documents=None,
                                             add_generation_prompt=True, **self.specials))
        except jinja2.TemplateError as exc:
            raise ValueError(f"the chat template of {self.where} refused the messages: {exc}") from None


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def template_source(folder: Path, config: dict[str, Any]) -> tuple[str, str] | None:
    """(template text, where it was read) of a model folder, or None when it has none. A list of
    named templates (older tokenizer_config.json) gives the one named 'default'."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), str(jinja)
    where = str(folder / "tokenizer_config.json")
    value = config.get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
        if value is None:
            raise ModelError(f"{where}: chat_template: a list of templates without one named 'default'")
    if value is None:
        return None
    if not isinstance(value, str):
        raise ModelError(f"{where}: chat_template: must be a string or a list of named templates")
    return value, where


def load_chat_template(folder: Path) -> ChatTemplate | None:
    """The chat template of a Hugging Face model folder, None when it has none."""
    config_path = folder / "tokenizer_config.json"
    config = read_json(config_path) if config_path.is_file() else {}
    if not isinstance(config, dict):
        raise ModelError(f"{config_path}: expected a JSON object")
    found = template_source(folder, config)
    if found is None:
        return None
    specials = {key: text for key in SPECIAL_KEYS if (text := _token_text(config.get(key))) is not None}
    return ChatTemplate(found[0], found[1], specials)
