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


@dataclass(frozen=True)
class DraftConfig:
    """The draft model's distillation recipe (`rhymerl pretrain --draft`); the defaults, at threads 1,
    made the shipped rhymerl/assets/tiny-arith-draft (its pretrain.json has the command)."""

    teacher: str = "builtin:tiny-arith"
    layers: int = 2  # transformer blocks of the draft (started from as many of the teacher's, evenly spread)
    steps: int = 600
    batch: int = 16
    lr: float = 1e-3
    max_ops: int = 52
    seed: int = 0
    threads: int = 0  # torch threads (0: torch's default)
    eval_every: int = 100  # save and report the draft's agreement with the teacher every N steps

    def command(self) -> str:
        """The `rhymerl pretrain` command line that runs this recipe (into OUT)."""
        return (f"rhymerl pretrain --draft --teacher {self.teacher} --layers {self.layers} --steps {self.steps} "
                f"--batch {self.batch} --lr {self.lr} --max-ops {self.max_ops} --seed {self.seed} "
                f"--threads {self.threads} --eval-every {self.eval_every} --out OUT")
