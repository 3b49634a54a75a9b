"""The `boxed` verifier: the last closed `\\boxed{}` of a response, normalised, against the answer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rhymerl.api.services import RewardSpec
from rhymerl.workers.reward.verifiers import BUILTIN, boxed, last_boxed


@pytest.mark.parametrize(("response", "answer", "reward"), [
    ("4 + 3 = 7 pens. \\boxed{7}", "7", 1.0),
    ("4 + 3 = 7 pens. \\boxed{8}", "7", 0.0),
    ("4 + 3 = 7 pens.", "7", 0.0),
    ("", "7", 0.0),
    ("first \\boxed{7}, then \\boxed{8}", "8", 1.0),
    ("first \\boxed{7}, then \\boxed{8}", "7", 0.0),
    ("\\boxed{ 1 2 }", "12", 1.0),
    ("\\boxed{1,234}", "1234", 1.0),
    ("\\boxed{1234}", "1,234", 1.0),
    ("\\boxed{12.0}", "12", 1.0),
    ("\\boxed{12.5}", "12", 0.0),
    ("\\boxed{+12}", "12", 1.0),
    ("\\boxed{\\$12}", "12", 1.0),
    ("\\boxed{$12$}", "12", 1.0),
    ("\\boxed{-3}", "3", 0.0),
    ("\\boxed{12,34}", "1234", 0.0),
    ("\\boxed{12 apples}", "12", 0.0),
    ("\\boxed{7} and an unclosed \\boxed{8", "7", 1.0),
    ("\\boxed{7", "7", 0.0),
    ("\\boxed 7", "7", 0.0),
])
def test_hand_computed_cases(response: str, answer: str, reward: float) -> None:
    assert boxed(response, answer) == reward


def test_braces_inside_a_box_are_balanced() -> None:
    assert last_boxed("so \\boxed{\\frac{1}{2}} here") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\boxed{3}}") == "\\boxed{3}"
    assert last_boxed("\\boxed{a \\boxed{3}") == "3"
    assert last_boxed("no box") is None


def test_the_spec_accepts_boxed_and_the_controller_finds_it_among_the_builtins() -> None:
    assert RewardSpec(verifier="boxed").verifier == "boxed"
    assert BUILTIN["boxed"]("prompt", "so \\boxed{1,000}", "1000") == 1.0


FILLER = st.text(alphabet=st.characters(blacklist_characters="\\", blacklist_categories=["Cs"]), max_size=40)


@given(before=FILLER, between=FILLER, after=FILLER, earlier=st.integers(), last=st.integers(),
       commas=st.booleans())
def test_any_integer_boxed_anywhere_is_found_and_the_last_box_wins(
        before: str, between: str, after: str, earlier: int, last: int, commas: bool) -> None:
    shown = f"{last:,}" if commas else str(last)
    response = f"{before}\\boxed{{{earlier}}}{between}\\boxed{{{shown}}}{after}"
    assert boxed(response, str(last)) == 1.0
    assert boxed(response, str(last + 1)) == 0.0
