"""What the loop asks of a tokenizer, and rhymerl's own: every printable ASCII character is one
token, plus pad/bos/eos.

Character level keeps the tiny model's task honest (it must write every digit) and makes token
counts equal visible lengths, which is what the history tools measure. A Hugging Face model's
tokenizer.json is read by hf_tokenizer.HfTokenizer behind the same interface.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from rhymerl.api import RLJob
from rhymerl.workers.model.chat_template import ChatTemplate, load_chat_template
from rhymerl.workers.model.folder import ModelError, model_dir, read_json

SPECIALS = ("<pad>", "<bos>", "<eos>")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))


class Tokenizer(Protocol):
    @property
    def eos_id(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def stop_ids(self) -> list[int]:
        """The tokens that end a response: eos_id first, then any other end token the model was
        tuned to emit (an instruct model's end of turn)."""
        ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """`text`'s tokens alone, no special token added."""
        ...

    def prompt_ids(self, text: str) -> list[int]:
        """What the model reads for a string prompt: its tokens with the special tokens the model puts first."""
        ...

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The model's chat template, None when it has none. Its rendered text already holds the special
        tokens the model puts first, so it is encoded with `encode`, not `prompt_ids`: call sites use
        `task.prompts.prompt_tokens`, which picks the right one."""
        ...

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens left out."""
        ...

    def unknown(self, text: str) -> int | None:
        """Index of the first character of `text` the tokenizer cannot represent, None when it can
        represent them all."""
        ...


class CharTokenizer:
    pad_id = 0
    bos_id = 1
    eos_id = 2

    def __init__(self, chat_template: ChatTemplate | None = None) -> None:
        self.chat_template = chat_template
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

    def prompt_ids(self, text: str) -> list[int]:
        return [self.bos_id, *self.encode(text)]

    @property
    def stop_ids(self) -> list[int]:
        return [self.eos_id]

    def unknown(self, text: str) -> int | None:
        if self._ids.keys() >= set(text):
            return None
        return next(i for i, ch in enumerate(text) if ch not in self._ids)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids if i >= len(SPECIALS))

    def save(self, path: Path) -> None:
        """`path` (tokenizer.json) and tokenizer_config.json beside it, in Hugging Face's format: a
        BPE model without merges over this vocabulary, <bos> put before a prompt, so transformers'
        AutoTokenizer and vLLM read the folder too."""
        from tokenizers import Tokenizer as RustTokenizer
        from tokenizers import decoders, models, processors

        tok = RustTokenizer(models.BPE(vocab={t: i for i, t in enumerate(self.vocab)}, merges=[]))
        tok.add_special_tokens(list(SPECIALS))
        tok.decoder = decoders.Fuse()
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", self.bos_id)])
        tok.save(str(path))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                  "pad_token": "<pad>", "model_max_length": 1024}
        (path.parent / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> CharTokenizer:
        if not is_char_tokenizer(path):
            raise ModelError(f"{path}: not a rhymerl character tokenizer of this version")
        return cls()


def is_char_tokenizer(path: Path) -> bool:
    """Whether tokenizer.json is this character tokenizer: in Hugging Face's format (a BPE model
    without merges over exactly this vocabulary) or in rhymerl's older {"type": "char"} one."""
    data = read_json(path, "; a model folder needs its tokenizer")
    if not isinstance(data, dict):
        return False
    vocab = CharTokenizer().vocab
    if data.get("type") == "char":
        return bool(data.get("vocab") == vocab)
    model = data.get("model")
    return (isinstance(model, dict) and model.get("type") == "BPE" and not model.get("merges")
            and model.get("vocab") == {t: i for i, t in enumerate(vocab)})


def load_tokenizer(folder: Path) -> Tokenizer:
    """The tokenizer of a model folder: rhymerl's character tokenizer or the folder's Hugging Face one."""
    if is_char_tokenizer(folder / "tokenizer.json"):
        return CharTokenizer(load_chat_template(folder))
    from rhymerl.workers.model.hf_tokenizer import HfTokenizer

    return HfTokenizer.load(folder)


def load_job_tokenizer(job: RLJob) -> Tokenizer:
    return load_tokenizer(model_dir(job.spec.model.path))
