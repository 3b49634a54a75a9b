"""What the drafter and acceptance benchmarks replay: per prompt, last epoch's responses (the
history, with rewards) and this epoch's (the targets), synthetic or read from a run's dumps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]


@dataclass
class PromptWork:
    """One prompt's history (previous epoch: tokens + rewards) and the responses to replay against it."""

    prompt_id: str
    prompt: I32
    history: list[tuple[I32, float]]
    targets: list[I32]
    epoch: int = 0  # epoch of the targets (0 for synthetic data)
    step: int = 0  # training step of the targets (0 for synthetic data)

    @property
    def history_tokens(self) -> int:
        return sum(len(t) for t, _ in self.history)


def synthetic_workload(
    prompts: int = 4,
    responses: int = 16,
    length: int = 16384,
    vocab: int = 32000,
    seed: int = 0,
) -> list[PromptWork]:
    """Histories that look like RL rollouts of one prompt across two adjacent epochs.

    Each prompt has a pool of phrases (Zipf-distributed token ids, lengths 1-24) and three solution
    paths made of phrases, so a response repeats formulas internally and shares long spans with its
    siblings. A response follows one path with phrase-level edits (substitute, insert, delete: ~9%
    of phrases) and 0.5% token noise. Path 0 is the "correct" one (reward 1 with p=0.8, others 0.3);
    the next epoch's responses pick path 0 more often, as a policy trained on the rewards would.
    """
    rng = np.random.default_rng(seed)
    work = []
    ranks = rng.permutation(vocab)
    for p in range(prompts):
        n_phr = 800
        phrase_len = np.clip(rng.geometric(1 / 7, size=n_phr), 1, 24)
        zipf = np.minimum(rng.zipf(1.25, size=int(phrase_len.sum())) - 1, vocab - 1)
        flat = ranks[zipf].astype(np.int32)
        cuts = np.concatenate([[0], np.cumsum(phrase_len)])
        phrases = [flat[cuts[i] : cuts[i + 1]] for i in range(n_phr)]
        popularity: NDArray[np.float64] = 1.0 / np.arange(1, n_phr + 1, dtype=np.float64) ** 0.9
        popularity /= popularity.sum()
        n_steps = int(length / phrase_len.mean() * 1.3) + 16
        base = rng.choice(n_phr, size=n_steps, p=popularity)
        paths = [base]
        for _ in range(2):
            path = base.copy()
            change = rng.random(n_steps) < 0.15
            path[change] = rng.choice(n_phr, size=int(change.sum()), p=popularity)
            paths.append(path)

        pool = _PhrasePool(phrases, popularity, ranks, vocab)
        history = [_respond(rng, pool, paths, (0.4, 0.3, 0.3), length) for _ in range(responses)]
        targets = [_respond(rng, pool, paths, (0.6, 0.2, 0.2), length)[0] for _ in range(responses)]
        work.append(PromptWork(f"synthetic-{p}", np.zeros(0, dtype=np.int32), history, targets, epoch=1))
    return work


def late_divergence_workload(
    prompts: int = 8,
    responses: int = 16,
    trunk: int = 192,
    tail: int = 64,
    wrong_share: float = 0.75,
    target_correct: float = 0.75,
    noise: float = 0.005,
    vocab: int = 4096,
    seed: int = 0,
) -> list[PromptWork]:
    """Where reward weighting should pay: every response of a prompt shares a trunk, then at the
    same late point either continues correctly (reward 1) or takes the prompt's one common slip
    (reward 0). `wrong_share` of last epoch's responses slipped, so frequency drafts the slip at the
    branch; `target_correct` of this epoch's responses continue correctly (a policy that learned
    from the rewards), so the reward-weighted branch is the right one. Token noise everywhere."""
    rng = np.random.default_rng(seed)
    n_wrong = round(wrong_share * responses)
    work = []
    for p in range(prompts):
        stem = rng.integers(0, vocab, size=trunk, dtype=np.int32)
        tails = {True: rng.integers(0, vocab, size=tail, dtype=np.int32),
                 False: rng.integers(0, vocab, size=tail, dtype=np.int32)}
        history = [(_noisy(rng, np.concatenate([stem, tails[k >= n_wrong]]), noise, vocab), float(k >= n_wrong))
                   for k in range(responses)]
        targets = [_noisy(rng, np.concatenate([stem, tails[bool(rng.random() < target_correct)]]), noise, vocab)
                   for _ in range(responses)]
        work.append(PromptWork(f"late-divergence-{p}", np.zeros(0, dtype=np.int32), history, targets, epoch=1))
    return work


def _noisy(rng: np.random.Generator, seq: I32, noise: float, vocab: int) -> I32:
    flip = rng.random(seq.size) < noise
    seq[flip] = rng.integers(0, vocab, size=int(flip.sum()), dtype=np.int32)
    return seq


@dataclass
class _PhrasePool:
    phrases: list[I32]
    popularity: NDArray[np.float64]
    ranks: NDArray[np.int64]
    vocab: int


def _respond(
    rng: np.random.Generator, pool: _PhrasePool, paths: list[I64], path_weights: Sequence[float], length: int
) -> tuple[I32, float]:
    """One response: a solution path with phrase-level edits and token noise, and its reward."""
    k = int(rng.choice(len(paths), p=np.asarray(path_weights)))
    n_phr = len(pool.phrases)
    parts: list[I32] = []
    total = 0
    for ph in paths[k]:
        u = rng.random()
        if u < 0.03:  # delete
            continue
        if u < 0.06:  # substitute
            ph = rng.choice(n_phr, p=pool.popularity)
        elif u < 0.09:  # insert an extra phrase first
            extra = pool.phrases[int(rng.choice(n_phr, p=pool.popularity))]
            parts.append(extra)
            total += len(extra)
        parts.append(pool.phrases[int(ph)])
        total += len(pool.phrases[int(ph)])
        if total >= length:
            break
    seq = np.concatenate(parts)[:length].copy()
    noise = rng.random(seq.size) < 0.005
    seq[noise] = pool.ranks[np.minimum(rng.zipf(1.25, size=int(noise.sum())) - 1, pool.vocab - 1)]
    reward = float(rng.random() < (0.8 if k == 0 else 0.3))
    return seq.astype(np.int32), reward


def dump_workload(run_dir: Any, latest_only: bool = False, first_epochs: bool = False,
                  history_epochs: int = 1) -> list[PromptWork]:
    """(prompt, epoch e) units from a run's rollout dumps: history = the prompt's responses of epochs
    e-history_epochs .. e-1 (a unit needs e-1). first_epochs: also a prompt's first epoch, with no
    history (what only its group can draft)."""
    from rhymerl.workers.dumps import read_run

    records = read_run(run_dir)
    groups: dict[tuple[str, int], list[Any]] = {}
    for rec in records:
        groups.setdefault((rec.prompt_id, rec.epoch), []).append(rec)
    units = []
    for (pid, epoch), recs in sorted(groups.items()):
        prev = groups.get((pid, epoch - 1))
        if not prev and not (first_epochs and not any(p == pid and e < epoch for p, e in groups)):
            continue
        units.append(
            PromptWork(
                prompt_id=pid,
                prompt=np.asarray(recs[0].prompt_ids, dtype=np.int32),
                history=[(np.asarray(r.response_ids, dtype=np.int32), float(r.reward))
                         for k in range(history_epochs, 0, -1) for r in groups.get((pid, epoch - k), [])]
                if prev else [],
                targets=[np.asarray(r.response_ids, dtype=np.int32) for r in recs],
                epoch=epoch,
                step=recs[0].step,
            )
        )
    if latest_only:
        last: dict[str, PromptWork] = {}
        for u in units:
            last[u.prompt_id] = u
        units = list(last.values())
    return units
