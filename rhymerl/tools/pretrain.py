"""Reproducible SFT pretraining of the embedded default model on arith-chain worked answers, and the
distillation of its draft model (`rhymerl pretrain --draft`, `distill_draft`).

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
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rhymerl.tools.pretrain_recipe import DraftConfig, PretrainConfig
from rhymerl.workers import atomic
from rhymerl.workers.model.folder import ModelConfig, ModelError
from rhymerl.workers.model.policy import save_model
from rhymerl.workers.model.tokenizer import CharTokenizer
from rhymerl.workers.model.transformer import TinyLlama, load_model
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
    from rhymerl.workers.rollout.engine import TorchEngine
    from rhymerl.workers.rollout.generation import GenRequest, SamplingParams

    engine = TorchEngine(model, tok.stop_ids, max_batch_size=len(problems))
    reqs = [GenRequest([tok.bos_id, *tok.encode(p.prompt)], i) for i, p in enumerate(problems)]
    out = engine.generate(reqs, SamplingParams(temperature=0.0, max_response_length=600))
    scores = [final_answer(tok.decode(r.response_ids), p.answer) for r, p in zip(out, problems, strict=True)]
    model.train()
    return float(sum(scores) / len(scores))


def _update(loss: torch.Tensor, model: torch.nn.Module, opt: torch.optim.Optimizer,
            sched: torch.optim.lr_scheduler.LRScheduler) -> None:
    """One optimizer step on `loss`, gradients clipped to norm 1."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()


def _save(out: Path, model: TinyLlama, tok: CharTokenizer, card: dict[str, Any]) -> None:
    """The model, its tokenizer and its card (pretrain.json) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    save_model(model, out)
    tok.save(out / "tokenizer.json")
    atomic.write_text(out / "pretrain.json", json.dumps(card, indent=2) + "\n")


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
        _update(loss, model, opt, sched)
        if on_step is not None:
            on_step(step, loss.item())
        if step % cfg.eval_every == 0 or step == cfg.steps:
            model.eval()
            acc = greedy_accuracy(model, tok, eval_set)
            history.append({"step": step, "loss": round(loss.item(), 5), "greedy_accuracy_eval64": acc,
                            "seconds": round(time.time() - t0, 1)})
            if on_eval is not None:
                on_eval(history[-1])
            card = {"params": model.num_parameters(), "steps": step, "planned_steps": cfg.steps,
                    "short_steps": cfg.short_steps, "batch": cfg.batch, "lr": cfg.lr, "seed": cfg.seed,
                    "max_ops": cfg.max_ops, "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "history": history}
            _save(out, model, tok, card)
            model.train()
    return history


def draft_blocks(teacher_layers: int, layers: int) -> list[int]:
    """The teacher's blocks a draft of `layers` blocks starts from: evenly spread, first and last kept."""
    if not 1 <= layers <= teacher_layers:
        raise ValueError(f"layers: {layers} is not between 1 and the teacher's {teacher_layers}")
    if layers == 1:
        return [0]
    return [round(i * (teacher_layers - 1) / (layers - 1)) for i in range(layers)]


def draft_student(teacher: TinyLlama, layers: int) -> TinyLlama:
    """A `layers`-block model of the teacher's shape and vocabulary, started from its embedding, final
    norm and some of its blocks (distillation then starts near the teacher, not from noise)."""
    student = TinyLlama(replace(teacher.cfg, num_hidden_layers=layers))
    student.embed_tokens.load_state_dict(teacher.embed_tokens.state_dict())
    student.norm.load_state_dict(teacher.norm.state_dict())
    for mine, theirs in zip(student.blocks, draft_blocks(teacher.cfg.num_hidden_layers, layers), strict=True):
        mine.load_state_dict(teacher.blocks[theirs].state_dict())
    return student


@torch.no_grad()
def draft_agreement(student: TinyLlama, teacher: TinyLlama, batches: list[tuple[torch.Tensor, torch.Tensor]]
                    ) -> dict[str, float]:
    """How well the student drafts for the teacher on held-out worked answers (teacher-forced, response
    positions): `greedy_match`, how often its greedy token is the teacher's (a one-token draft's
    acceptance when the policy decodes greedily), and `sampled_acceptance`, the teacher's probability
    of the student's greedy token (its acceptance when the policy samples at temperature 1)."""
    match = accept = 0.0
    count = 0
    for tokens, targets in batches:
        real = targets != -100
        guess = student(tokens).argmax(-1)[real]
        probs = torch.softmax(teacher(tokens).float(), -1)[real]
        match += float((guess == probs.argmax(-1)).sum())
        accept += float(probs.gather(-1, guess[:, None]).sum())
        count += int(real.sum())
    return {"greedy_match": round(match / count, 4), "sampled_acceptance": round(accept / count, 4)}


def _load_teacher(teacher_dir: Path, tok: CharTokenizer) -> TinyLlama:
    """The frozen teacher in `teacher_dir`; a ModelError unless it has the character tokenizer's vocabulary."""
    teacher = load_model(teacher_dir).eval()
    if teacher.cfg.vocab_size != tok.vocab_size:
        raise ModelError(f"{teacher_dir / 'config.json'}: vocab_size {teacher.cfg.vocab_size} is not the "
                         f"embedded character tokenizer's {tok.vocab_size}; the draft is distilled on arith-chain")
    teacher.requires_grad_(False)
    return teacher


def _distill_loss(student: TinyLlama, teacher: TinyLlama, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of the next-token distributions on the response positions."""
    real = targets != -100
    with torch.no_grad():
        teacher_logp = F.log_softmax(teacher(tokens)[real], -1)
    student_logp = F.log_softmax(student(tokens)[real], -1)
    return F.kl_div(student_logp, teacher_logp, log_target=True, reduction="batchmean")


def _draft_card(cfg: DraftConfig, student: TinyLlama, teacher_layers: int, step: int, ceiling: float,
                history: list[dict[str, float]]) -> dict[str, Any]:
    """The draft's pretrain.json after `step`; `ceiling`: the teacher's acceptance drafting for itself."""
    return {"draft_of": cfg.teacher, "command": cfg.command(), "params": student.num_parameters(),
            "layers": cfg.layers,
            "teacher_blocks": draft_blocks(teacher_layers, cfg.layers),
            "steps": step, "planned_steps": cfg.steps, "batch": cfg.batch, "lr": cfg.lr, "seed": cfg.seed,
            "max_ops": cfg.max_ops, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "teacher_sampled_acceptance": ceiling,
            "history": history}


def distill_draft(cfg: DraftConfig, teacher_dir: Path, out: Path, on_step: Callable[[int, float], None] | None = None,
                  on_eval: Callable[[dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """Distil a small draft model from the teacher in `teacher_dir` (the embedded model's tokenizer) and
    save it, with the tokenizer and a card (pretrain.json), into `out` at every evaluation.

    The loss is KL(teacher || student) of the next-token distributions on the response positions of
    the pretraining corpus (`make_batch`: worked arith-chain answers of every length): the policy
    samples at temperature 1, where a greedy draft token is accepted with the teacher's probability
    of it, so the student learns the whole distribution, not the corpus's one answer. Only forward
    passes of the teacher are needed (no generation), which keeps it to minutes on a CPU.
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    tok = CharTokenizer()
    teacher = _load_teacher(teacher_dir, tok)
    student = draft_student(teacher, cfg.layers)
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, cfg.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / cfg.steps)))))
    held_out = random.Random(10_000)
    eval_batches = [make_batch(tok, held_out, cfg.batch, cfg.max_ops) for _ in range(4)]
    ceiling = draft_agreement(teacher, teacher, eval_batches)["sampled_acceptance"]  # the teacher drafting itself
    t0 = time.time()
    history: list[dict[str, float]] = []
    for step in range(1, cfg.steps + 1):
        tokens, targets = make_batch(tok, rng, cfg.batch, cfg.max_ops)
        loss = _distill_loss(student, teacher, tokens, targets)
        _update(loss, student, opt, sched)
        if on_step is not None:
            on_step(step, loss.item())
        if step % cfg.eval_every == 0 or step == cfg.steps:
            student.eval()
            row: dict[str, float] = {"step": step, "kl": round(loss.item(), 5),
                                     **draft_agreement(student, teacher, eval_batches),
                                     "seconds": round(time.time() - t0, 1)}
            history.append(row)
            if on_eval is not None:
                on_eval(row)
            _save(out, student, tok, _draft_card(cfg, student, teacher.cfg.num_hidden_layers, step, ceiling, history))
            student.train()
    return history
