"""The word-problems task: seeded, its splits disjoint, its answers right, its levels as documented."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from rhymerl.workers.task.word_problems import LEVELS, SYSTEM, Problem, evaluate, generate, split_of

APPLY: dict[str, Callable[[int, int], int]] = {"+": lambda a, b: a + b, "-": lambda a, b: a - b,
                                               "*": lambda a, b: a * b, "/": lambda a, b: a // b}


def _brute_force(p: Problem) -> list[int]:
    """Every running value of the problem, each share checked to be exact."""
    values, value = [], p.start
    for op, k in p.ops:
        assert op != "/" or value % k == 0, f"{p.prompt_id}: {value} does not share among {k}"
        value = APPLY[op](value, k)
        values.append(value)
    return values


def test_the_same_seed_and_split_give_the_same_problems_and_another_seed_others() -> None:
    assert generate(60, 7, "train") == generate(60, 7, "train")
    assert [p.question for p in generate(60, 7)] != [p.question for p in generate(60, 8)]


def test_prompt_ids_name_split_seed_and_index_and_a_longer_set_extends_a_shorter_one() -> None:
    short, long = generate(10, 3, "heldout"), generate(25, 3, "heldout")
    assert long[:10] == short
    assert [p.prompt_id for p in short[:2]] == ["wp-heldout-3-00000", "wp-heldout-3-00001"]


@pytest.mark.parametrize(("train_seed", "heldout_seed"), [(0, 0), (0, 1), (5, 2)])
def test_no_problem_text_is_in_both_splits_whatever_their_seeds(train_seed: int, heldout_seed: int) -> None:
    train = generate(1500, train_seed, "train", (1,))
    heldout = generate(300, heldout_seed, "heldout", (1,))
    assert not {p.question for p in train} & {p.question for p in heldout}
    assert {split_of(p.question) for p in train} == {"train"}
    assert {split_of(p.question) for p in heldout} == {"heldout"}


def test_no_problem_text_repeats_within_a_split() -> None:
    problems = generate(1500, 0, "train", (1,))
    assert len({p.question for p in problems}) == len(problems)


def test_every_answer_is_the_brute_force_value_of_its_operations_and_each_count_stays_positive() -> None:
    for p in generate(500, 11, "train"):
        values = _brute_force(p)
        assert p.answer == str(values[-1]) == str(evaluate(p.start, p.ops))
        assert all(v > 0 for v in values), p


def test_the_question_states_the_start_and_every_operand_in_order() -> None:
    for p in generate(300, 2, "train"):
        numbers = [int(n) for n in re.findall(r"\d+", p.question)]
        assert numbers == [p.start, *(k for _, k in p.ops)], p.question


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_each_level_has_its_steps_operations_and_number_ranges(level: int) -> None:
    spec = LEVELS[level]
    for p in generate(200, 4, "train", (level,)):
        assert p.level == level and len(p.ops) == spec.steps
        assert {op for op, _ in p.ops} <= set(spec.ops)
        first, first_k = p.ops[0]
        shared_total = first == "/"
        assert spec.lo <= (p.start // first_k if shared_total else p.start) <= spec.hi
        for op, k in p.ops:
            lo, hi = (2, 9) if op in "*/" else spec.change or (spec.lo, spec.hi)
            assert lo <= k <= hi, p


def test_the_documented_levels_are_these() -> None:
    table = {n: (lv.steps, lv.lo, lv.hi, set(lv.ops), lv.change) for n, lv in LEVELS.items()}
    assert table == {1: (1, 2, 9, {"+", "-"}, None), 2: (1, 2, 9, {"*", "/"}, None), 3: (1, 10, 99, {"+", "-"}, None),
                     4: (2, 2, 9, {"+", "-", "*", "/"}, None), 5: (2, 10, 99, {"+", "-"}, (2, 9))}


def test_levels_repeat_in_the_given_order_so_a_repeated_level_weighs_more() -> None:
    assert [p.level for p in generate(8, 0, "train", (1, 1, 3))] == [1, 1, 3, 1, 1, 3, 1, 1]
    assert [p.level for p in generate(9, 0)] == [1, 1, 1, 2, 2, 3, 4, 5, 1]


def test_the_prompt_asks_for_a_box_shows_one_worked_example_and_ends_with_the_problem() -> None:
    p = generate(1, 0)[0]
    messages = p.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "\\boxed{}" in SYSTEM and messages[0]["content"] == SYSTEM
    assert "\\boxed{7}" in messages[2]["content"]
    assert messages[-1]["content"] == p.question


@pytest.mark.parametrize(("kwargs", "field"), [({"split": "test"}, "split"), ({"levels": (0,)}, "levels"),
                                                ({"levels": ()}, "levels"), ({"num": -1}, "num")])
def test_bad_arguments_are_refused_naming_the_argument(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"num": 3, "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=f"^{field}:"):
        generate(**args)  # type: ignore[arg-type,unused-ignore]


def test_the_builtin_source_gives_the_splits_problems_as_chat_prompts_located_by_id() -> None:
    from rhymerl.api.inputs import DataSpec
    from rhymerl.workers.task.prompts import DataError, located_prompts

    located = located_prompts(DataSpec(source="builtin:word-problems", num_prompts=5, seed=3, split="heldout"))
    expected = generate(5, 3, "heldout")
    assert [where for where, _ in located] == [f"builtin:word-problems prompt {p.prompt_id}" for p in expected]
    for (_, prompt), problem in zip(located, expected, strict=True):
        assert (prompt.prompt_id, prompt.text, prompt.answer) == (problem.prompt_id, problem.question, problem.answer)
        assert prompt.messages == tuple((m["role"], m["content"]) for m in problem.messages())
    with pytest.raises(DataError, match=r"data\.chatTemplate: none"):
        located_prompts(DataSpec(source="builtin:word-problems", chat_template="none"))
    with pytest.raises(DataError, match="known: builtin:arith-chain, builtin:word-problems"):
        located_prompts(DataSpec(source="builtin:word-chains"))
