"""Which results of a reward call count, how a failure reads, and when a step's failures stop the run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rhymerl.api.services import RewardSpec
from rhymerl.workers.reward.outcome import Outcome, check_failures, judge, raised
from rhymerl.workers.reward.verifiers import RewardError


@pytest.mark.parametrize(("result", "value"), [(0.25, 0.25), (3, 3.0), (np.float32(0.5), 0.5), (np.int64(2), 2.0),
                                               (True, 1.0), (False, 0.0), (-1e300, -1e300)])
def test_finite_real_numbers_and_bools_are_rewards(result: object, value: float) -> None:
    assert judge(result, -7.0) == Outcome(value)


@pytest.mark.parametrize(("result", "reason"), [
    ("abc", "returned 'abc' (str), not a number"),
    (None, "returned None, not a number"),
    ([1.0], "returned [1.0] (list), not a number"),
    (float("nan"), "returned nan"),
    (float("inf"), "returned inf"),
    (float("-inf"), "returned -inf"),
    (10**400, "(int), not a float"),
])
def test_anything_else_scores_the_failure_reward_and_says_what_came_back(result: object, reason: str) -> None:
    out = judge(result, -7.0)
    assert out.value == -7.0
    assert out.error is not None and reason in out.error


def test_a_long_returned_string_is_cut_short_in_the_reason() -> None:
    out = judge("x" * 10_000, 0.0)
    assert out.error is not None and len(out.error) < 100


def test_an_exception_reads_as_its_type_and_message_on_one_line() -> None:
    assert raised(ValueError("bad"), 0.5) == Outcome(0.5, "raised ValueError: bad")
    assert raised(KeyError("a"), 0.0).error == "raised KeyError: 'a'"
    assert raised(RuntimeError("two\nlines"), 0.0).error == "raised RuntimeError: two lines"
    assert raised(ZeroDivisionError(), 0.0).error == "raised ZeroDivisionError"
    long = raised(ValueError("y" * 5000), 0.0).error
    assert long is not None and len(long) <= 300 and long.endswith("...")


def test_failures_up_to_the_allowed_share_let_the_step_pass(tmp_path: Path) -> None:
    spec = RewardSpec(function="m:f", max_failed_fraction=0.5)
    check_failures(["raised ValueError: x", None, "returned nan", None], spec, 3, tmp_path / "d.jsonl")
    check_failures([None, None], RewardSpec(function="m:f", max_failed_fraction=0.0), 3, tmp_path / "d.jsonl")


def test_more_failures_than_allowed_stop_with_the_function_the_count_the_first_reason_and_the_dump(
        tmp_path: Path) -> None:
    spec = RewardSpec(function="mod:score", max_failed_fraction=0.5)
    dump = tmp_path / "rollouts" / "step_000003.jsonl"
    with pytest.raises(RewardError) as err:
        check_failures([None, "raised ValueError: bad", "returned nan", "returned nan"], spec, 3, dump)
    msg = str(err.value)
    assert "spec.reward.function 'mod:score'" in msg
    assert "3 of 4 samples in step 3" in msg
    assert "first: raised ValueError: bad" in msg
    assert str(dump) in msg
    assert "\n" not in msg
