"""A tiny GGUF file written as llama.cpp writes a Llama: its metadata, a byte-level BPE vocabulary with
a chat template and end-of-turn token, q/k rows permuted llama.cpp's way, the matrices Q8_0-quantized."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
HIDDEN, HEADS, LAYERS, FFN = 32, 2, 2, 64


def _byte_spelling() -> dict[int, str]:
    """GPT-2's byte-to-character table (what a byte-level vocabulary is written in)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(kept), 0
    for b in range(256):
        if b not in kept:
            kept.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(kept, chars, strict=True)}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's reordering of q/k rows (convert_hf_to_gguf's LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, seed: int = 0) -> int:
    """Write the file; returns its vocabulary size."""
    import gguf

    spell = _byte_spelling()
    tokens = [*SPECIALS, *(spell[b] for b in range(256)), "17", "25", spell[ord(" ")] + "="]
    merges = ["1 7", "2 5", f"{spell[ord(' ')]} ="]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(0)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    for name, tensor in _tensors(len(tokens), seed).items():
        if tensor.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(tensor, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(tokens)


def _tensors(vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)

    def norm() -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)

    out = {"token_embd.weight": mat(vocab, HIDDEN), "output_norm.weight": norm()}
    for i in range(LAYERS):
        out |= {f"blk.{i}.attn_norm.weight": norm(), f"blk.{i}.ffn_norm.weight": norm(),
                f"blk.{i}.attn_q.weight": _permute(mat(HIDDEN, HIDDEN), HEADS),
                f"blk.{i}.attn_k.weight": _permute(mat(HIDDEN, HIDDEN), HEADS),
                f"blk.{i}.attn_v.weight": mat(HIDDEN, HIDDEN), f"blk.{i}.attn_output.weight": mat(HIDDEN, HIDDEN),
                f"blk.{i}.ffn_gate.weight": mat(FFN, HIDDEN), f"blk.{i}.ffn_up.weight": mat(FFN, HIDDEN),
                f"blk.{i}.ffn_down.weight": mat(HIDDEN, FFN)}
    return out
