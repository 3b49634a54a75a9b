"""A Hugging Face model's tokenizer (its tokenizer.json) behind the loop's Tokenizer interface.

Read with the `tokenizers` library, not transformers: preflight checks every prompt against the
tokenizer before a job starts and must not pay for importing torch. The special tokens come from
where a Hugging Face folder keeps them: tokenizer_config.json (eos, pad), then generation_config.json
and config.json (eos id). What goes in front of a prompt (Llama's <s>/<|begin_of_text|>, nothing
for Qwen2) is the tokenizer's own post-processor, as transformers applies it.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as RustTokenizer

from rhymerl.workers.model.chat_template import ChatTemplate, load_chat_template
from rhymerl.workers.model.folder import ModelError, read_json


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: object) -> list[int]:
    """Token ids as a config writes them: one integer or a list of them."""
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


class HfTokenizer:
    def __init__(self, tok: RustTokenizer, eos_id: int, pad_id: int, unk_id: int | None,
                 more_stops: list[int] | None = None, chat_template: ChatTemplate | None = None) -> None:
        self.tok = tok
        self.chat_template = chat_template
        self._stops = [eos_id, *(t for t in dict.fromkeys(more_stops or []) if t != eos_id)]  # eos first
        self._pad_id = pad_id
        self.unk_id = unk_id
        self._representable: dict[str, bool] = {}

    @property
    def eos_id(self) -> int:
        return self._stops[0]

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def stop_ids(self) -> list[int]:
        return list(self._stops)

    @property
    def vocab_size(self) -> int:
        return int(self.tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def prompt_ids(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))

    def unknown(self, text: str) -> int | None:
        """The first character that has no token of its own: it becomes the unknown token or, in a
        tokenizer without one, is dropped. Checked one distinct character at a time (the library's
        offsets shift after a dropped character, so they cannot locate it)."""
        fresh = sorted(set(text) - self._representable.keys())
        for ch, enc in zip(fresh, self.tok.encode_batch(fresh, add_special_tokens=False), strict=True):
            self._representable[ch] = bool(enc.ids) and self.unk_id not in enc.ids
        return next((i for i, ch in enumerate(text) if not self._representable[ch]), None)

    @classmethod
    def load(cls, folder: Path) -> HfTokenizer:
        path = folder / "tokenizer.json"
        try:
            tok = RustTokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception for every malformed file
            raise ModelError(f"{path}: not a Hugging Face tokenizer ({exc})") from None
        config_path = folder / "tokenizer_config.json"
        config = read_json(config_path) if config_path.is_file() else {}
        if not isinstance(config, dict):
            raise ModelError(f"{config_path}: expected a JSON object")

        def special(key: str) -> int | None:
            text = _token_text(config.get(key))
            if text is None:
                return None
            tid = tok.token_to_id(text)
            if tid is None:
                raise ModelError(f"{config_path}: {key} {text!r} is not a token of {path.name}")
            return int(tid)

        eos = special("eos_token")
        more: list[int] = []  # generation_config's end tokens (an instruct model's end of turn too)
        for name in ("generation_config.json", "config.json"):
            data = read_json(folder / name) if (folder / name).is_file() else None
            ids = _ids(data.get("eos_token_id")) if isinstance(data, dict) else []
            more += ids
            eos = ids[0] if eos is None and ids else eos
        if eos is None:
            raise ModelError(f"{folder}: no end-of-sequence token (eos_token in tokenizer_config.json or "
                             "eos_token_id in generation_config.json / config.json)")
        pad = special("pad_token")
        return cls(tok, eos, eos if pad is None else pad, special("unk_token"), more, load_chat_template(folder))
