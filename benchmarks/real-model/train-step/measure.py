"""The trainer's scoring pass on SmolLM2-135M-Instruct with the output layer on every position (then the
response's rows gathered, as the trainer did before 2026-12-01), on the response's positions alone
(`model(tokens, at=...)`, what it does now), and so with activation checkpointing
(`model.activationCheckpointing`): seconds of forward + backward and peak resident memory.

Each (way, repeat) runs in a fresh process, the ways interleaved, so one's memory never hides the
other's. Usage: .venv/bin/python benchmarks/real-model/train-step/measure.py OUT [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

WAYS = ("every-position", "response-positions", "response-positions+checkpointing")
SHAPE = {"samples": 32, "prompt": 110, "response": 60}  # the word-problems job's step: 4 prompts x 8


def one(way: str) -> dict[str, float]:
    import torch

    from rhymerl.algorithms import objectives as obj
    from rhymerl.workers.model.folder import model_dir
    from rhymerl.workers.model.transformer import load_model

    torch.manual_seed(0)
    model = load_model(model_dir("builtin:smollm2-135m-instruct"))
    model.checkpoint_activations(way.endswith("+checkpointing"))
    b, p, n = SHAPE["samples"], SHAPE["prompt"], SHAPE["response"]
    tokens = torch.randint(3, model.cfg.vocab_size, (b, p + n))
    at = torch.arange(p - 1, p - 1 + n).expand(b, n)
    targets = tokens[:, p:]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    began = time.perf_counter()
    if way == "every-position":
        logits = model(tokens)
        logits = logits.gather(1, at.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    else:
        logits = model(tokens, at=at)
    logp, entropy = obj.token_logprobs_and_entropy(logits, targets)
    (logp.mean() + 0.0 * entropy.mean()).backward()
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_gib": peak / 2**20, "added_gib": (peak - base) / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one", choices=WAYS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    runs: dict[str, list[dict[str, float]]] = {w: [] for w in WAYS}
    for r in range(args.repeats):
        for way in WAYS:
            done = subprocess.run([sys.executable, "-P", __file__, str(args.out), "--one", way], check=True,
                                  capture_output=True, text=True)
            runs[way].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"repeat {r + 1}/{args.repeats} {way}: {runs[way][-1]}", flush=True)
    rows = [{"way": w, **{k: round(statistics.median(x[k] for x in runs[w]), 3) for k in runs[w][0]}} for w in WAYS]
    before, after, recomputed = rows
    lines = ["| output layer on | forward+backward s | peak RSS GiB | added by the pass GiB |", "|---|---|---|---|"]
    lines += [f"| {r['way']} | {r['seconds']} | {r['peak_gib']} | {r['added_gib']} |" for r in rows]
    lines.append(f"\nresponse positions: {before['seconds'] / after['seconds']:.2f}x faster, "
                 f"{before['added_gib'] / after['added_gib']:.2f}x less memory added "
                 f"(medians of {args.repeats}; shape {SHAPE}); checkpointing: "
                 f"{before['added_gib'] / recomputed['added_gib']:.1f}x less memory added than every-position, "
                 f"{recomputed['seconds'] / after['seconds']:.2f}x the time of response-positions")
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"shape": SHAPE, "rows": rows, "runs": runs}, indent=1) + "\n")
    (args.out / "table.md").write_text(table + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, label in ((axes[0], "seconds", "forward + backward (s)"), (axes[1], "added_gib", "memory added (GiB)")):
        ax.bar([r["way"].replace("+", "\n+") for r in rows], [r[key] for r in rows],
               color=["#999999", "#3b7dd8", "#2a9d8f"])
        ax.set_ylabel(label)
    fig.suptitle("SmolLM2-135M scoring pass, 32 x (110 prompt + 60 response) tokens")
    fig.tight_layout()
    fig.savefig(args.out / "train_step.png", dpi=120)


if __name__ == "__main__":
    main()
