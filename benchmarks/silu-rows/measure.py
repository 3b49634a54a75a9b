"""What the engine's row-invariant SiLU costs (workers/model/row_invariant.py silu_rows, commit 3f43934):
the MLP's `forward` (torch's F.silu over the whole block) against `forward_rows`, and a whole
`forward_cached` pass of the embedded model with either, side by side in one process, interleaved.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/silu-rows/measure.py > benchmarks/silu-rows/results.md
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from functools import partial

import torch

from rhymerl.api import RLJob
from rhymerl.tools.bench.timing import interleaved_medians
from rhymerl.workers.model.registry import load_native_policy
from rhymerl.workers.model.transformer import MLP, KVCache, ModelConfig, TinyLlama

ROWS = (4, 16, 97, 256)
THREADS = 2


def mlp_rows() -> list[str]:
    out = ["| MLP (hidden x width) | rows | F.silu us | silu_rows us | silu_rows / F.silu |", "|---|---|---|---|---|"]
    for hidden, width, repeats in ((128, 352, 300), (576, 1536, 60)):  # the embedded model's, SmolLM2-135M's
        cfg = ModelConfig(vocab_size=99, hidden_size=hidden, num_hidden_layers=1, num_attention_heads=4,
                          intermediate_size=width, max_position_embeddings=512)
        mlp = MLP(cfg).eval()
        for rows in ROWS:
            x = torch.randn(rows, hidden)
            with torch.inference_mode():
                t = interleaved_medians({"old": partial(mlp.forward, x), "new": partial(mlp.forward_rows, x)}, repeats)
            out.append(f"| {hidden} x {width} | {rows} | {t['old'] * 1e6:.1f} | {t['new'] * 1e6:.1f} | "
                       f"{t['new'] / t['old']:.2f} |")
    return out


def _pass(forward: Callable[[MLP, torch.Tensor], torch.Tensor], model: TinyLlama,
          *args: torch.Tensor | KVCache) -> object:
    """One forward_cached pass with `forward` as the engine's MLP."""
    MLP.forward_rows = forward  # type: ignore[method-assign]
    return model.forward_cached(*args)  # type: ignore[arg-type]


def passes() -> list[str]:
    model, _ = load_native_policy(RLJob.model_validate({"spec": {}}).spec.model)
    out = ["| embedded model pass | tokens | F.silu ms | silu_rows ms | silu_rows / F.silu |", "|---|---|---|---|---|"]
    rows_forward = MLP.forward_rows
    for tokens in ROWS:
        slots = min(tokens, 8)
        width = -(-tokens // slots)
        block = torch.randint(3, model.cfg.vocab_size, (slots, width))
        counts = torch.full((slots,), width)
        cache = KVCache(model.cfg, slots, 160 + width + 16, torch.float32, torch.device("cpu"))
        start = torch.full((slots,), 160)

        args = (model, block, start, cache, counts)
        with torch.inference_mode():
            t = interleaved_medians({"old": partial(_pass, MLP.forward, *args),
                                     "new": partial(_pass, rows_forward, *args)}, 100)
        MLP.forward_rows = rows_forward  # type: ignore[method-assign]
        out.append(f"| {slots} slots x {width} | {slots * width} | {t['old'] * 1e3:.2f} | {t['new'] * 1e3:.2f} | "
                   f"{t['new'] / t['old']:.2f} |")
    return out


def main() -> None:
    torch.set_num_threads(THREADS)
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}, "
          f"torch {torch.__version__} at {THREADS} threads; command: `PYTHONSAFEPATH=1 .venv/bin/python "
          "benchmarks/silu-rows/measure.py`; medians, the two variants interleaved\n")
    print("\n".join(mlp_rows()))
    print()
    print("\n".join(passes()))


if __name__ == "__main__":
    main()
