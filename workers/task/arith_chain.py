"""arith-chain: a verifiable task whose answers need written-out steps and have a long tail of lengths.

A prompt is a start value and a labelled chain of single-digit operations modulo 100::

    37|a+8 b-3 c+5?

The worked answer writes one line per operation (the operation copied from the prompt, then the
running value before and after it), then the result::

    a+8 37=45
    b-3 45=42
    c+5 42=47
    =47

Each line is ten tokens, so length follows the operation count, which is drawn log-normally (long
tail). Every line needs three things a small transformer can learn: copy the labelled operation
from the prompt (an induction-head lookup: the line starts with the label), copy the previous
value, add a digit modulo 100. Errors compound along the chain, so a partly trained model solves
short chains far more often than long ones: room for RL to help.
"""

from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass

LABELS = string.ascii_lowercase + string.ascii_uppercase
MODULUS = 100


@dataclass(frozen=True)
class Problem:
    prompt_id: str
    prompt: str
    answer: str


def _ops_count(rng: random.Random, lo: int, median: int, hi: int) -> int:
    n = round(math.exp(rng.gauss(math.log(median), 0.45)))
    return min(hi, max(lo, n))


def make_problem(rng: random.Random, n_ops: int, prompt_id: str) -> Problem:
    if not 1 <= n_ops <= len(LABELS):
        raise ValueError(f"n_ops: must be in 1..{len(LABELS)}, got {n_ops}")
    value = rng.randrange(MODULUS)
    ops = [(rng.choice("+-"), rng.randrange(1, 10)) for _ in range(n_ops)]
    prompt = f"{value:02d}|" + " ".join(f"{LABELS[i]}{op}{d}" for i, (op, d) in enumerate(ops)) + "?"
    for op, d in ops:
        value = (value + d) % MODULUS if op == "+" else (value - d) % MODULUS
    return Problem(prompt_id, prompt, f"{value:02d}")


def solve(prompt: str) -> str:
    """The worked answer for a prompt, as the SFT target."""
    head, _, body = prompt.rstrip("?").partition("|")
    value = int(head)
    lines = []
    for item in body.split(" "):
        label, op, d = item[0], item[1], int(item[2:])
        new = (value + d) % MODULUS if op == "+" else (value - d) % MODULUS
        lines.append(f"{label}{op}{d} {value:02d}={new:02d}")
        value = new
    lines.append(f"={value:02d}")
    return "\n".join(lines)


def generate(num: int, seed: int, min_ops: int = 8, median_ops: int = 16, max_ops: int = 52) -> list[Problem]:
    """A seeded prompt set; prompt ids are stable for a given (seed, index)."""
    rng = random.Random(f"arith-chain:{seed}")
    return [make_problem(rng, _ops_count(rng, min_ops, median_ops, max_ops), f"ac-{seed}-{i:05d}")
            for i in range(num)]
