"""A character tokenizer: every printable ASCII character is one token, plus pad/bos/eos.

Character level keeps the tiny model's task honest (it must write every digit) and makes token
counts equal visible lengths, which is what the history tools measure.
"""

from __future__ import annotations

import json
from pathlib import Path

from rhymerl.workers.model.folder import ModelError, read_json

SPECIALS = ("<pad>", "<bos>", "<eos>")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


class CharTokenizer:
    pad_id = 0
    bos_id = 1
    eos_id = 2

    def __init__(self) -> None:
        self.vocab: list[str] = [*SPECIALS, *CHARS]
        self._ids = {ch: i for i, ch in enumerate(self.vocab) if i >= len(SPECIALS)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the tokenizer's vocabulary") from None

    def unknown(self, text: str) -> int | None:
        """Index of the first character of `text` that has no token, None when every one has."""
        if self._ids.keys() >= set(text):
            return None
        return next(i for i, ch in enumerate(text) if ch not in self._ids)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids if i >= len(SPECIALS))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"type": "char", "vocab": self.vocab}, indent=0))

    @classmethod
    def load(cls, path: Path) -> CharTokenizer:
        data = read_json(path)
        tok = cls()
        if not isinstance(data, dict) or data.get("type") != "char" or data.get("vocab") != tok.vocab:
            raise ModelError(f"{path}: not a rhymerl character tokenizer of this version")
        return tok
