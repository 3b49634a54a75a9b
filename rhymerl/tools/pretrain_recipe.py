"""The embedded model's SFT recipe, apart from the torch code that runs it, so the CLI can show its
defaults without importing torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PretrainConfig:
    """The SFT recipe; the defaults made the shipped rhymerl/assets/tiny-arith."""

    steps: int = 1800
    batch: int = 16
    lr: float = 3e-3
    max_ops: int = 52
    seed: int = 0
    threads: int = 0  # torch threads (0: torch's default)
    short_steps: int = 800  # first phase: steps on short chains only (double batch)
    eval_every: int = 250  # save and report greedy accuracy every N steps
