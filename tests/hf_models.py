"""Small Hugging Face model folders written for tests, as the hub ships them: a transformers model of
the Llama or Qwen2 family (grouped-query attention; Qwen2 with projection biases), its
tokenizer.json (`tokenizers`, one token per printable ASCII character) and tokenizer_config.json.

Llama's tokenizer puts <s> before a prompt and has an unknown token; Qwen2's puts nothing before it
and has none (a character it lacks is dropped), as the real ones do.
"""

from __future__ import annotations

import copy
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


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
"""Llama 3's RoPE scaling, with an original context short enough that every band of it (kept, ramped,
slowed) applies to some of a 32-dimension head's frequencies."""


def write_model(folder: Path, family: str, seed: int = 0, **options: object) -> Path:
    """A randomly initialised 2-layer `family` model (llama, qwen2, mistral) with grouped-query attention
    (4 query heads, 2 key/value heads of 32 dimensions, the smallest vLLM's CPU attention takes), an
    embedding padded past the tokenizer's vocabulary, and its tokenizer; `options` go to its config
    (attention_bias, mlp_bias, rope_scaling, tie_word_embeddings, ...)."""
    import transformers

    options = copy.deepcopy(options)  # transformers writes into the dicts it is given (rope_scaling)
    vocab = write_tokenizer(folder, "qwen2" if family == "qwen2" else "llama")
    shape = {"vocab_size": 128, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
    assert vocab <= shape["vocab_size"]
    torch.manual_seed(seed)
    if family == "qwen2":
        config: transformers.PretrainedConfig = transformers.Qwen2Config(
            **shape, eos_token_id=0, **{"tie_word_embeddings": True, **options})
    else:
        kind = transformers.LlamaConfig if family == "llama" else transformers.MistralConfig
        config = kind(**shape, bos_token_id=1, eos_token_id=2, **{"tie_word_embeddings": False, **options})
    model = transformers.AutoModelForCausalLM.from_config(config)
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False) or family == "qwen2":
        with torch.no_grad():  # transformers starts biases at zero: make them count
            for name, param in model.named_parameters():
                if name.endswith(".bias"):
                    param.normal_(std=0.02)
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder
