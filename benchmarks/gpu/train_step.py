"""Seconds per training step of rhymerl's trainer on one GPU, plain and sharded with FSDP2.

    python benchmarks/gpu/train_step.py OUT_DIR [--sizes 25m,110m,350m] [--steps 3]

For each model size (random Llama-shaped TinyLlama, float32 weights, vocabulary 32000), one
GRPO step of 64 responses (prompt 128 + response 384 tokens, advantages +-1, micro-batches of
16384 tokens) is timed: `plain` trains the model as one rank does; `fsdp2` shards it over a
one-rank NCCL group first (`ranks.shard`), the data-parallel path of `train.replicas x gpus`
ranks with its all-gather and reduce-scatter per block, on one GPU. One warm-up step, then the
median of --steps timed steps (CUDA synchronised). Writes results.json and train_step.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from rhymerl.api.algorithm import AlgorithmSpec
from rhymerl.workers.model.folder import ModelConfig
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.train import ranks
from rhymerl.workers.train.trainer import Trainer, TrainSample

SIZES = {  # hidden, layers, heads, intermediate
    "tiny": (64, 2, 2, 128),  # a dry run of the script (--device cpu)
    "25m": (512, 4, 8, 1408),
    "110m": (768, 12, 12, 2048),
    "350m": (1024, 24, 16, 2816),
}
VOCAB, PROMPT, RESPONSE, SAMPLES = 32000, 128, 384, 64


def batch() -> list[TrainSample]:
    g = torch.Generator().manual_seed(0)
    return [TrainSample(torch.randint(3, VOCAB, (PROMPT,), generator=g).tolist(),
                        torch.randint(3, VOCAB, (RESPONSE,), generator=g).tolist(), 1.0 if i % 2 else -1.0)
            for i in range(SAMPLES)]


def model(size: str, device: str) -> TinyLlama:
    hidden, layers, heads, inter = SIZES[size]
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=inter, max_position_embeddings=1024)
    return TinyLlama(cfg).to(device)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(size: str, mode: str, steps: int, device: str) -> dict[str, object]:
    m = model(size, device)
    params = sum(p.numel() for p in m.parameters())
    if mode == "fsdp2":
        ranks.shard(m)
    trainer = Trainer(m, AlgorithmSpec(group_size=8, prompts_per_step=8, lr=1e-5), 1.0, micro_batch_tokens=16384)
    samples = batch()
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps + 1):
        sync(device)
        t0 = time.perf_counter()
        stats = trainer.step(samples)
        sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    tokens = SAMPLES * (PROMPT + RESPONSE)
    median = statistics.median(times)
    return {"size": size, "mode": mode, "params_m": round(params / 1e6, 1), "seconds": round(median, 4),
            "tokens_per_s": round(tokens / median), "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            "loss": round(stats["loss"], 5), "runs": [round(t, 4) for t in times]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--sizes", default="25m,110m,350m")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    store, host, port = ranks.listen()
    ranks.join(ranks.Ranks(0, 1), host, port, store)
    rows = []
    for size in args.sizes.split(","):
        for mode in ("plain", "fsdp2"):
            rows.append(time_steps(size, mode, args.steps, args.device))
            print(json.dumps(rows[-1]), flush=True)
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    device = {"gpu": gpu, "torch": torch.__version__, "command": " ".join(sys.argv)}
    (args.out / "results.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    print("| size | params (M) | mode | s/step | tokens/s | peak GiB |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} | {r['params_m']} | {r['mode']} | {r['seconds']} | {r['tokens_per_s']} | {r['peak_gib']} |")
    plot(rows, args.out / "train_step.png", device["gpu"])
    ranks.leave()


def plot(rows: list[dict[str, object]], path: Path, gpu: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    sizes = list(dict.fromkeys(str(r["size"]) for r in rows))
    for i, mode in enumerate(("plain", "fsdp2")):
        vals = [next(float(str(r["tokens_per_s"])) for r in rows if r["size"] == s and r["mode"] == mode)
                for s in sizes]
        ax.bar([j + 0.4 * i for j in range(len(sizes))], vals, 0.4, label=mode)
    ax.set_xticks([j + 0.2 for j in range(len(sizes))], sizes)
    ax.set_ylabel("training tokens / s")
    ax.set_title(f"one GRPO step, {SAMPLES} x {PROMPT + RESPONSE} tokens, float32, {gpu}", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
