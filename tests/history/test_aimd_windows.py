"""The AIMD draft window (RhymeRL §5.4), one native rule for every draft source."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.algorithms.drafting import AimdWindows
from rhymerl.api.speculation import DraftWindowSpec


def reference(window: int, drafted: int, accepted: int, spec: DraftWindowSpec) -> int:
    if drafted == 0:
        return window
    return min(window + spec.step, spec.max) if accepted == drafted else spec.initial


rounds = st.lists(st.lists(st.tuples(st.integers(0, 40), st.floats(0, 1)), min_size=3, max_size=3),
                  min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(initial=st.integers(1, 8), step=st.integers(1, 8), extra=st.integers(0, 40), history=rounds)
def test_windows_follow_the_rule_round_after_round(initial: int, step: int, extra: int,
                                                   history: list[list[tuple[int, float]]]) -> None:
    spec = DraftWindowSpec(initial=initial, step=step, max=initial + extra)
    windows = AimdWindows(spec, 3)
    expected = [initial] * 3
    for round_ in history:
        drafted = [min(d, int(w)) for (d, _), w in zip(round_, windows.windows, strict=True)]
        accepted = [int(d * f) if f < 0.5 else d for d, (_, f) in zip(drafted, round_, strict=True)]
        windows.update(drafted, accepted)
        expected = [reference(w, d, a, spec) for w, d, a in zip(expected, drafted, accepted, strict=True)]
        assert windows.windows.tolist() == expected


def test_a_full_acceptance_grows_a_rejection_resets_and_no_draft_keeps() -> None:
    windows = AimdWindows(DraftWindowSpec(initial=2, step=2, max=5), 3)
    windows.update([2, 2, 0], [2, 1, 0])
    assert windows.windows.tolist() == [4, 2, 2]
    windows.update([4, 0, 0], [4, 0, 0])
    assert windows.windows.tolist() == [5, 2, 2]  # capped at max


def test_updating_chosen_rows_leaves_the_others_alone() -> None:
    windows = AimdWindows(DraftWindowSpec(initial=2, step=3, max=32), 4)
    windows.update([2, 2], [2, 2], rows=[3, 1])
    assert windows.windows.tolist() == [2, 5, 2, 5]
    windows.reset(1)
    windows.resize(5)
    assert windows.windows.tolist() == [2, 2, 2, 5, 2]


def test_an_accepted_count_above_the_draft_is_refused_before_any_change() -> None:
    windows = AimdWindows(DraftWindowSpec(initial=2, step=2, max=32), 2)
    with pytest.raises(ValueError, match="accepted <= drafted"):
        windows.update([2, 1], [2, 3])
    assert windows.windows.tolist() == [2, 2]
    assert windows.windows.dtype == np.int32
