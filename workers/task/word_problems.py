"""word-problems: short grade-school word problems for a small pretrained chat model, scored on `\\boxed{}`.

Unlike arith-chain (written for the embedded model trained from scratch), these suit a pretrained
instruct model such as SmolLM2-135M-Instruct: one or two everyday operations (add, subtract,
multiply, share equally) told about a named person and a kind of object, with an integer answer.
Levels grade the difficulty so the untrained model solves some prompts but not all, which is what
gives GRPO groups mixed rewards::

    level  steps  operations                amounts   changes
      1      1    add, subtract             2..9      2..9
      2      1    multiply, share equally   2..9
      3      1    add, subtract             10..99    10..99
      4      2    any                       2..9      2..9
      5      2    add, subtract             10..99    2..9

An amount is what a person has at the start, a change what they get or give away; a multiplier or
divisor (bags, dollars each, friends to share among) is 2..9 at every level; a shared total is the
divisor times a share in the amounts' range. Level 5 keeps its changes single-digit because with
two-digit changes too the untrained 135M model solved none of 128 samples (README of the benchmark).

Each problem stores its operations, so its answer can be recomputed (`evaluate`). The `train` and
`heldout` splits draw from different random streams and, to be disjoint by construction for any
seeds, keep only problem texts whose hash falls in their own bucket.

The prompt shows one worked example as an earlier chat turn: without it the 135M model almost
never writes a box (measured in benchmarks/real-model/task-difficulty/).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Split = Literal["train", "heldout"]
Op = Literal["+", "-", "*", "/"]
SPLITS: tuple[Split, ...] = ("train", "heldout")
HELDOUT_BUCKETS = 8  # one problem text in HELDOUT_BUCKETS belongs to the heldout split
FACTOR_RANGE = (2, 9)
MAX_TRIES_PER_PROBLEM = 1000

SYSTEM = "Reason briefly, then put the final answer in \\boxed{}."
EXAMPLE = ("Sara has 4 pens. She buys 3 more. How many pens does Sara have now?",
           "Sara has 4 + 3 = 7 pens. \\boxed{7}")

NAMES = (("Tom", "he", "his"), ("Mia", "she", "her"), ("Sam", "he", "his"), ("Lily", "she", "her"),
         ("Ben", "he", "his"), ("Emma", "she", "her"), ("Leo", "he", "his"), ("Zoe", "she", "her"),
         ("Max", "he", "his"), ("Anna", "she", "her"), ("Jack", "he", "his"), ("Ella", "she", "her"))
OBJECTS = (("apple", "apples"), ("marble", "marbles"), ("cookie", "cookies"), ("pencil", "pencils"),
           ("sticker", "stickers"), ("book", "books"), ("shell", "shells"), ("card", "cards"),
           ("balloon", "balloons"), ("toy car", "toy cars"), ("candy", "candies"), ("stamp", "stamps"))
GAIN = ("buys", "finds", "gets", "is given")
LOSE = ("gives away", "eats", "loses", "sells")


ANY: tuple[Op, ...] = ("+", "-", "*", "/")


@dataclass(frozen=True)
class Level:
    steps: int
    lo: int
    hi: int
    ops: tuple[Op, ...] = ANY
    change: tuple[int, int] | None = None  # range of what is added or taken away; None: lo..hi


LEVELS: dict[int, Level] = {1: Level(1, 2, 9, ("+", "-")), 2: Level(1, 2, 9, ("*", "/")),
                            3: Level(1, 10, 99, ("+", "-")), 4: Level(2, 2, 9), 5: Level(2, 10, 99, ("+", "-"), (2, 9))}
# Weighted to the easy levels: the untrained 135M model then solves about 10% of samples (temperature
# 1.0) and about 37% of 8-sample groups are mixed; the hard levels are room to grow (see the benchmark).
DEFAULT_LEVELS = (1, 1, 1, 2, 2, 3, 4, 5)


@dataclass(frozen=True)
class Problem:
    """`start` then `ops` applied left to right give `answer`; `question` is the user message."""

    prompt_id: str
    level: int
    question: str
    answer: str
    start: int
    ops: tuple[tuple[Op, int], ...]

    def messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages: the instruction, the worked example as a turn, then the problem."""
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": EXAMPLE[0]},
                {"role": "assistant", "content": EXAMPLE[1]}, {"role": "user", "content": self.question}]


def evaluate(start: int, ops: Sequence[tuple[Op, int]]) -> int:
    """The value after applying `ops` to `start`; ValueError when a share is not exact."""
    value = start
    for op, k in ops:
        if op == "+":
            value += k
        elif op == "-":
            value -= k
        elif op == "*":
            value *= k
        else:
            if value % k:
                raise ValueError(f"{value} does not share equally among {k}")
            value //= k
    return value


def _draw_ops(rng: random.Random, level: Level) -> tuple[int, list[tuple[Op, int]]]:
    """Operations for a problem: multiplying and sharing only as the first or last step, amounts in range."""
    amount = (level.lo, level.hi)
    kinds: list[Op] = [rng.choice(level.ops)] if level.steps == 1 else \
        [rng.choice([op for op in level.ops if op != "/"]), rng.choice(level.ops)]
    ops: list[tuple[Op, int]] = []
    start = rng.randint(*amount)
    for i, op in enumerate(kinds):
        if op == "/" and i == 0:
            k = rng.randint(*FACTOR_RANGE)
            start = k * rng.randint(*amount)
        elif op == "/":
            k = rng.randint(*FACTOR_RANGE)
        else:
            k = rng.randint(*(FACTOR_RANGE if op == "*" else level.change or amount))
        ops.append((op, k))
    return start, ops


def _valid(start: int, ops: Sequence[tuple[Op, int]]) -> bool:
    """Every running value a positive whole count; a product of two products is not a grade-school step."""
    if len(ops) == 2 and ops[0][0] == "*" and ops[1][0] == "*":
        return False
    try:
        values = [evaluate(start, ops[:i + 1]) for i in range(len(ops))]
    except ValueError:
        return False
    return all(v > 0 for v in values)


def _first_sentence(name: str, start: int, ops: Sequence[tuple[Op, int]], obj: tuple[str, str]) -> str:
    if ops[0][0] == "*":
        return f"{name} has {start} bags with {ops[0][1]} {obj[1]} in each bag."
    return f"{name} has {start} {obj[1]}."


def _step_sentence(rng: random.Random, op: Op, k: int, pronoun: str, obj: tuple[str, str], first: bool) -> str:
    then = "" if first else "Then "
    subject = pronoun.capitalize() if first else pronoun
    if op == "+":
        return f"{then}{subject} {rng.choice(GAIN)} {k} more."
    if op == "-":
        return f"{then}{subject} {rng.choice(LOSE)} {k} of them."
    if op == "*":
        return f"Each {obj[0]} costs {k} dollars."
    return f"{then}{subject} shares them equally among {k} friends."


def _question(last: Op, who: tuple[str, str, str], obj: tuple[str, str], cost: bool) -> str:
    if cost:
        return f"How many dollars are all of {who[2]} {obj[1]} worth?"
    if last == "/":
        return f"How many {obj[1]} does each friend get?"
    if last == "*":
        return f"How many {obj[1]} does {who[0]} have in all?"
    return f"How many {obj[1]} does {who[0]} have now?"


def _text(rng: random.Random, start: int, ops: Sequence[tuple[Op, int]]) -> str:
    who, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    parts = [_first_sentence(who[0], start, ops, obj)]
    for i, (op, k) in enumerate(ops):
        if not (i == 0 and op == "*"):
            parts.append(_step_sentence(rng, op, k, who[1], obj, first=i == 0))
    cost = ops[-1][0] == "*" and len(ops) > 1
    parts.append(_question(ops[-1][0], who, obj, cost))
    return " ".join(parts)


def split_of(question: str) -> Split:
    """The split a problem text belongs to, whatever stream drew it: a hash bucket of the text."""
    bucket = int.from_bytes(hashlib.sha256(question.encode()).digest()[:8], "big") % HELDOUT_BUCKETS
    return "heldout" if bucket == 0 else "train"


def _problem(rng: random.Random, level_no: int, split: Split, seen: set[str], prompt_id: str) -> Problem:
    level = LEVELS[level_no]
    for _ in range(MAX_TRIES_PER_PROBLEM):
        start, ops = _draw_ops(rng, level)
        if not _valid(start, ops):
            continue
        question = _text(rng, start, ops)
        if question in seen or split_of(question) != split:
            continue
        seen.add(question)
        return Problem(prompt_id, level_no, question, str(evaluate(start, ops)), start, tuple(ops))
    raise ValueError(f"num: more distinct level-{level_no} problems asked for than the generator finds")


def generate(num: int, seed: int, split: Split = "train", levels: Sequence[int] = DEFAULT_LEVELS) -> list[Problem]:
    """`num` distinct problems, problem i at level `levels[i % len(levels)]` (repeat a level to weight it).

    Deterministic for (seed, split, levels); prompt ids are `wp-<split>-<seed>-<index>`. No problem
    text of one split occurs in the other, for any seeds. ValueError names a bad argument.
    """
    if split not in SPLITS:
        raise ValueError(f"split: must be one of {', '.join(SPLITS)}, got {split!r}")
    if not levels or any(lv not in LEVELS for lv in levels):
        raise ValueError(f"levels: must be a non-empty list of {sorted(LEVELS)}, got {list(levels)}")
    if num < 0:
        raise ValueError(f"num: must be at least 0, got {num}")
    rng = random.Random(f"word-problems:{split}:{seed}")
    seen: set[str] = set()
    return [_problem(rng, levels[i % len(levels)], split, seen, f"wp-{split}-{seed}-{i:05d}") for i in range(num)]
