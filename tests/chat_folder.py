"""A small Hugging Face tokenizer folder with a ChatML chat template (SmolLM2's), built for a test:
a character-level BPE tokenizer.json and a tokenizer_config.json, readable by transformers too."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, processors

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
BOS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ raise_exception('no user') "
                "if m['content'] == '' else '' }}{% endif %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")


def chat_folder(folder: Path, template: object = SMOLLM2_TEMPLATE, bos_first: bool = False) -> Path:
    """Write the tokenizer files into `folder`; `template` goes into tokenizer_config.json as it is;
    with `bos_first` the tokenizer puts <|endoftext|> before a prompt, as Llama's puts <s>."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate([*SPECIALS, *CHARS])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(list(SPECIALS))
    tok.decoder = decoders.Fuse()
    if bos_first:
        tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A",
                                                           special_tokens=[("<|endoftext|>", 0)])
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "model_max_length": 2048, "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
