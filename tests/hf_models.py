"""Small Hugging Face model folders written for tests, as the hub ships them: a transformers model of
the Llama or Qwen2 family (grouped-query attention; Qwen2 with projection biases), its
tokenizer.json (`tokenizers`, one token per printable ASCII character) and tokenizer_config.json.

Llama's tokenizer puts <s> before a prompt and has an unknown token; Qwen2's puts nothing before it
and has none (a character it lacks is dropped), as the real ones do.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
SPECIALS = {"llama": ["<unk>", "<s>", "</s>"], "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}


def write_tokenizer(folder: Path, family: str) -> int:
    """tokenizer.json and tokenizer_config.json of `family`'s style; returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, processors

    specials = SPECIALS[family]
    vocab = {t: i for i, t in enumerate([*specials, *CHARS])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>" if family == "llama" else None))
    tok.add_special_tokens(specials)
    tok.decoder = decoders.Fuse()
    if family == "llama":
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}
    else:
        config = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "bos_token": None}
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              **config}))
    return len(vocab)


def write_model(folder: Path, family: str, seed: int = 0) -> Path:
    """A randomly initialised 2-layer `family` model with grouped-query attention (4 query heads, 2
    key/value heads of 32 dimensions, the smallest vLLM's CPU attention takes), an embedding padded past the tokenizer's vocabulary, and its tokenizer."""
    import transformers

    vocab = write_tokenizer(folder, family)
    shape = {"vocab_size": 128, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
    assert vocab <= shape["vocab_size"]
    torch.manual_seed(seed)
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            **shape, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            **shape, eos_token_id=0, tie_word_embeddings=True))
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder
