"""Reproducible SFT pretraining of the embedded default model on arith-chain worked answers.

Run ``rhymerl pretrain --out rhymerl/assets/tiny-arith`` (about 15 minutes on a 2-core CPU). The step budget is fixed, not timed, so the
same seed gives the same weights on the same torch build. It deliberately stops early: RL should start from clearly non-zero but far from
perfect accuracy, which is where GRPO has something to learn.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from rhymerl.tools.pretrain_recipe import PretrainConfig
from rhymerl.workers import atomic
from rhymerl.workers.model.folder import ModelConfig
from rhymerl.workers.model.policy import save_model
from rhymerl.workers.model.tokenizer import CharTokenizer
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.task import arith_chain


def encode_example(tok: CharTokenizer, prompt: str, response: str) -> tuple[list[int], int]:
    """[bos] prompt response [eos]; returns ids and the index where the response starts."""
    head = [tok.bos_id, *tok.encode(prompt)]
    return head + tok.encode(response) + [tok.eos_id], len(head)


def make_batch(tok: CharTokenizer, rng: random.Random, size: int, max_ops: int,
               short_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of similar-length problems (little padding).

    `short_only` batches (the first phase) hold chains of at most 8 operations: cheap, and where
    the lookup of a labelled operation in the prompt is learnt. Later batches are mostly chains of
    up to 24 operations and cover every length up to max_ops so every label and position is seen.
    """
    rows, starts = [], []
    if short_only:
        base = rng.randint(1, min(8, max_ops))
    else:
        base = rng.randint(1, min(24, max_ops)) if rng.random() < 0.8 else rng.randint(1, max_ops)
    for _ in range(size):
        n_ops = min(max_ops, max(1, base + rng.randint(-3, 3)))
        problem = arith_chain.make_problem(rng, n_ops, "sft")
        ids, start = encode_example(tok, problem.prompt, arith_chain.solve(problem.prompt))
        rows.append(ids)
        starts.append(start)
    width = max(len(r) for r in rows)
    tokens = torch.full((size, width), tok.pad_id, dtype=torch.int64)
    targets = torch.full((size, width), -100, dtype=torch.int64)
    for i, (ids, start) in enumerate(zip(rows, starts, strict=True)):
        tokens[i, : len(ids)] = torch.tensor(ids)
        targets[i, start - 1 : len(ids) - 1] = torch.tensor(ids[start:])
    return tokens, targets


@torch.no_grad()
def greedy_accuracy(model: TinyLlama, tok: CharTokenizer, problems: list[arith_chain.Problem]) -> float:
    from rhymerl.workers.reward.verifiers import final_answer
    from rhymerl.workers.rollout.engine import GenRequest, SamplingParams, TorchEngine

    engine = TorchEngine(model, tok.eos_id, max_batch_size=len(problems))
    reqs = [GenRequest([tok.bos_id, *tok.encode(p.prompt)], i) for i, p in enumerate(problems)]
    out = engine.generate(reqs, SamplingParams(temperature=0.0, max_response_length=600))
    scores = [final_answer(tok.decode(r.response_ids), p.answer) for r, p in zip(out, problems, strict=True)]
    model.train()
    return float(sum(scores) / len(scores))


def pretrain(cfg: PretrainConfig, out: Path, on_step: Callable[[int, float], None] | None = None,
             on_eval: Callable[[dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """Train from scratch, saving the model, tokenizer and a card (pretrain.json) into `out` at every
    evaluation; `on_step(step, loss)` and `on_eval(row)` follow progress. Returns the eval history."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    tok = CharTokenizer()
    model = TinyLlama(ModelConfig(vocab_size=tok.vocab_size))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, cfg.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, cfg.steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    t0 = time.time()
    eval_set = arith_chain.generate(64, seed=10_000)
    history: list[dict[str, float]] = []
    for step in range(1, cfg.steps + 1):
        short_phase = step <= cfg.short_steps
        tokens, targets = make_batch(tok, rng, 2 * cfg.batch if short_phase else cfg.batch, cfg.max_ops,
                                     short_only=short_phase)
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if on_step is not None:
            on_step(step, loss.item())
        if step % cfg.eval_every == 0 or step == cfg.steps:
            model.eval()
            acc = greedy_accuracy(model, tok, eval_set)
            history.append({"step": step, "loss": round(loss.item(), 5), "greedy_accuracy_eval64": acc,
                            "seconds": round(time.time() - t0, 1)})
            if on_eval is not None:
                on_eval(history[-1])
            out.mkdir(parents=True, exist_ok=True)
            save_model(model, out)
            tok.save(out / "tokenizer.json")
            card = {"params": model.num_parameters(), "steps": step, "planned_steps": cfg.steps,
                    "short_steps": cfg.short_steps, "batch": cfg.batch, "lr": cfg.lr, "seed": cfg.seed,
                    "max_ops": cfg.max_ops, "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "history": history}
            atomic.write_text(out / "pretrain.json", json.dumps(card, indent=2) + "\n")
            model.train()
    return history
