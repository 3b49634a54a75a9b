"""A character tokenizer: every printable ASCII character is one token, plus pad/bos/eos.

Character level keeps the tiny model's task honest (it must write every digit) and makes token
counts equal visible lengths, which is what the history tools measure.
"""

from __future__ import annotations

import json
from pathlib import Path

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

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids if i >= len(SPECIALS))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"type": "char", "vocab": self.vocab}, indent=0))

    @classmethod
    def load(cls, path: Path) -> CharTokenizer:
        data = json.loads(path.read_text())
        tok = cls()
        if data.get("type") != "char" or data.get("vocab") != tok.vocab:
            raise ValueError(f"{path}: not a rhymerl character tokenizer of this version")
        return tok
