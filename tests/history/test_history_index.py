"""The native history index drafts exactly what the rules (RhymeRL §5.3-5.4) say, checked against a reference."""

from __future__ import annotations

import numpy as np
import pytest
from history_reference import ReferenceIndex, oracle_accepted, reward_weights
from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.algorithms.drafting import HistoryIndex

Response = tuple[list[int], float]

rewards = st.sampled_from([-1.0, 0.0, 0.25, 1.0, 3.0]) | st.floats(-10, 10, allow_nan=False, allow_infinity=False)
responses = st.lists(st.integers(0, 4), max_size=40)
histories = st.lists(st.tuples(responses, rewards), max_size=6)
nonempty_histories = st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=4, max_size=40), rewards), min_size=1, max_size=6
)


@st.composite
def history_and_context(draw: st.DrawFn) -> tuple[list[Response], list[int]]:
    hist = draw(st.one_of(histories, nonempty_histories, nonempty_histories))
    seqs = [s for s, _ in hist if s]
    if seqs and draw(st.integers(0, 4)) > 0:  # mostly a piece of a history response, maybe with a new tail
        seq = draw(st.sampled_from(seqs))
        j = draw(st.integers(0, len(seq)))
        i = draw(st.integers(0, max(0, j - 3))) if draw(st.booleans()) else draw(st.integers(0, j))
        tail = draw(st.lists(st.integers(0, 4), max_size=2)) if draw(st.booleans()) else []
        context = seq[i:j] + tail
    else:
        context = draw(st.lists(st.integers(0, 5), max_size=12))
    return hist, context


@settings(max_examples=300, deadline=None)
@given(
    data=history_and_context(),
    reward_weighted=st.booleans(),
    prefix_min=st.integers(1, 4),
    extra=st.integers(0, 4),
    max_tokens=st.integers(0, 12),
)
def test_native_drafts_equal_the_reference_on_random_histories(
    data: tuple[list[Response], list[int]], reward_weighted: bool, prefix_min: int, extra: int, max_tokens: int
) -> None:
    hist, context = data
    prefix_max = prefix_min + extra
    native = HistoryIndex.build(hist, reward_weighted=reward_weighted)
    ref = ReferenceIndex(hist, reward_weighted=reward_weighted)
    got = native.draft(context, max_tokens, prefix_max=prefix_max, prefix_min=prefix_min).tolist()
    assert got == ref.draft(context, max_tokens, prefix_max, prefix_min)


@settings(max_examples=300, deadline=None)
@given(
    data=history_and_context(),
    reward_weighted=st.booleans(),
    prefix_min=st.integers(1, 3),
    extra=st.integers(0, 5),
    min_prob=st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.9, 1.0]),
)
def test_confidence_cutoff_drafts_equal_the_reference(
    data: tuple[list[Response], list[int]], reward_weighted: bool, prefix_min: int, extra: int, min_prob: float
) -> None:
    hist, context = data
    native = HistoryIndex.build(hist, reward_weighted=reward_weighted)
    ref = ReferenceIndex(hist, reward_weighted=reward_weighted)
    got = native.draft(context, 10, prefix_max=prefix_min + extra, prefix_min=prefix_min, min_prob=min_prob)
    assert got.tolist() == ref.draft(context, 10, prefix_min + extra, prefix_min, min_prob)


def test_min_prob_stops_the_draft_at_an_uncertain_branch() -> None:
    hist = [([1, 2, 3, 4, 5, 6], 0.0), ([1, 2, 3, 4, 5, 7], 0.0), ([1, 2, 3, 4, 5, 8], 0.0)]
    index = HistoryIndex.build(hist)
    assert index.draft([1, 2, 3], 4).tolist() == [4, 5, 6]  # 6, 7, 8 tie: smallest token
    assert index.draft([1, 2, 3], 4, min_prob=0.5).tolist() == [4, 5]  # 6 has probability 1/3


@settings(max_examples=200, deadline=None)
@given(data=history_and_context(), prefix_min=st.integers(1, 4))
def test_every_draft_is_a_real_continuation_in_the_history(
    data: tuple[list[Response], list[int]], prefix_min: int
) -> None:
    hist, context = data
    draft = HistoryIndex.build(hist).draft(context, 16, prefix_max=7, prefix_min=prefix_min).tolist()
    if draft:
        assert len(context) >= prefix_min
        needle = context[len(context) - prefix_min :] + draft
        assert ReferenceIndex(hist).occurrences(needle), "draft plus its matched prefix must occur in the history"


@settings(max_examples=150, deadline=None)
@given(hist=histories, pattern=st.lists(st.integers(0, 4), min_size=1, max_size=5), reward_weighted=st.booleans())
def test_priority_is_the_summed_weight_and_count_of_occurrences(
    hist: list[Response], pattern: list[int], reward_weighted: bool
) -> None:
    native = HistoryIndex.build(hist, reward_weighted=reward_weighted)
    assert native.priority(pattern) == ReferenceIndex(hist, reward_weighted).priority(pattern)


def test_a_reward_weighted_draft_follows_the_highest_reward_branch_and_the_default_the_most_frequent() -> None:
    hist = [
        ([9, 1, 2, 3, 4, 4, 4], 1.0),  # one correct response takes branch 4
        ([8, 1, 2, 3, 5, 5, 5], 0.0),  # two wrong ones take branch 5
        ([7, 1, 2, 3, 5, 5, 6], 0.0),
    ]
    assert HistoryIndex.build(hist, reward_weighted=True).draft([1, 2, 3], 3).tolist() == [4, 4, 4]
    assert HistoryIndex.build(hist).draft([1, 2, 3], 3).tolist() == [5, 5, 5]


def test_each_draft_token_re_ranks_the_branches_below_the_chosen_one() -> None:
    hist = [([1, 2, 3, 4, 6], 1.0), ([1, 2, 3, 4, 7], 0.9), ([1, 2, 3, 4, 7], 0.9), ([0, 2, 3, 5], 0.0)]
    # after 1 2 3 the branch 4 carries 1.0 + 0.9 + 0.9; below it, 7 (1.8) beats 6 (1.0)
    assert HistoryIndex.build(hist, reward_weighted=True).draft([1, 2, 3], 5).tolist() == [4, 7]


def test_equal_rewards_fall_back_to_frequency_and_then_to_the_smaller_token() -> None:
    hist = [([1, 2, 3, 8], 0.0), ([1, 2, 3, 8], 0.0), ([1, 2, 3, 6], 0.0)]
    assert HistoryIndex.build(hist, reward_weighted=True).draft([1, 2, 3], 1).tolist() == [8]
    tie = [([1, 2, 3, 8], 1.0), ([1, 2, 3, 6], 1.0)]
    assert HistoryIndex.build(tie, reward_weighted=True).draft([1, 2, 3], 1).tolist() == [6]


def test_negative_rewards_are_shifted_so_the_worst_response_still_weighs_epsilon() -> None:
    assert reward_weights([-3.0, -1.0, -2.0], True) == [1, 1 + 2**20, 1 + 2**19]
    hist = [([1, 2, 3, 4], -3.0), ([1, 2, 3, 4], -3.0), ([1, 2, 3, 5], -1.0)]
    index = HistoryIndex.build(hist, reward_weighted=True)
    assert index.priority([3, 4]) == (2, 2)  # two worst responses: epsilon each, still counted
    assert index.priority([3, 5]) == (1 + 2**20, 1)
    assert index.draft([1, 2, 3], 1).tolist() == [5]


def test_all_zero_rewards_rank_by_frequency() -> None:
    hist = [([1, 2, 3, 4], 0.0), ([1, 2, 3, 5], 0.0), ([1, 2, 3, 5], 0.0)]
    assert HistoryIndex.build(hist, reward_weighted=True).priority([1, 2, 3, 5]) == (2, 2)
    assert HistoryIndex.build(hist, reward_weighted=True).draft([1, 2, 3], 1).tolist() == [5]


def test_prefix_match_falls_back_from_seven_tokens_to_three() -> None:
    hist = [
        ([10, 11, 12, 13, 14, 15, 16, 1], 0.0),  # the full 7-token context continues with 1
        ([20, 21, 22, 23, 14, 15, 16, 2], 1.0),  # only the last 3 tokens match here, continues with 2
        ([30, 31, 32, 33, 34, 15, 16, 3], 1.0),  # only the last 2 tokens match here
    ]
    index = HistoryIndex.build(hist, reward_weighted=True)
    assert index.draft([10, 11, 12, 13, 14, 15, 16], 1).tolist() == [1]  # longest (7) match wins
    assert index.draft([99, 11, 12, 13, 14, 15, 16], 1).tolist() == [1]  # 6 tokens
    assert index.draft([99, 98, 97, 96, 14, 15, 16], 1).tolist() == [2]  # 3 tokens: both 1 and 2 follow, 2 has reward
    assert index.draft([99, 98, 97, 96, 95, 15, 16], 1).tolist() == []  # 2 < prefix_min
    assert index.draft([99, 98, 97, 96, 95, 15, 16], 1, prefix_min=2).tolist() == [2]
    assert index.draft([14, 15, 16], 1, prefix_max=2, prefix_min=2).tolist() == [2]  # capped at 2 tokens


def test_a_match_without_continuation_falls_back_to_a_shorter_prefix() -> None:
    hist = [([5, 6, 7, 8], 0.0), ([1, 6, 7, 8, 9, 10], 0.0)]
    # 5 6 7 8 occurs only at a response's end; 6 7 8 continues in the other response
    assert HistoryIndex.build(hist).draft([5, 6, 7, 8], 2).tolist() == [9, 10]


def test_an_empty_history_drafts_nothing() -> None:
    histories: list[list[Response]] = [[], [([], 1.0)], [([1, 2], 0.5)]]
    for hist in histories:
        index = HistoryIndex.build(hist)
        assert index.draft([1, 2, 3], 8).tolist() == []


def test_stats_count_tokens_states_and_bytes() -> None:
    index = HistoryIndex.build([([1, 2, 3, 1, 2, 3], 1.0), ([1, 2, 4], 0.0)])
    stats = index.stats()
    assert (stats.responses, stats.tokens) == (2, 9)
    assert stats.states >= 1 and stats.edges >= stats.states - 1
    assert stats.serialized_bytes == len(index.to_bytes())
    assert stats.bytes_per_token > 0


def test_build_accepts_numpy_arrays_and_flat_arrays_alike() -> None:
    a = np.array([1, 2, 3, 4], dtype=np.int64)
    b = np.array([1, 2, 3, 5], dtype=np.int32)
    one = HistoryIndex.build([(a, 1.0), (b, 0.0)])
    two = HistoryIndex.from_arrays(np.array([1, 2, 3, 4, 1, 2, 3, 5]), [0, 4, 8], [1.0, 0.0])
    assert one.to_bytes() == two.to_bytes()


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), -float("inf")])
def test_build_rejects_non_finite_rewards(reward: float) -> None:
    with pytest.raises(ValueError, match="not finite"):
        HistoryIndex.build([([1, 2, 3], reward)])


def test_build_rejects_inconsistent_offsets_and_bad_token_ids() -> None:
    with pytest.raises(ValueError, match="offsets"):
        HistoryIndex.from_arrays([1, 2, 3], [0, 2], [1.0])
    with pytest.raises(ValueError, match="non-decreasing"):
        HistoryIndex.from_arrays([1, 2, 3], [0, 3, 2, 3], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="int32"):
        HistoryIndex.build([([2**40], 1.0)])
    with pytest.raises(ValueError, match="integers"):
        HistoryIndex.build([([1.5, 2.0], 1.0)])


@pytest.mark.parametrize("seed", range(4))
def test_native_drafts_equal_the_reference_at_every_position_of_mutated_histories(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 12, size=120)
    hist: list[Response] = []
    for _ in range(5):
        seq = base.copy()
        flip = rng.random(seq.size) < 0.1
        seq[flip] = rng.integers(0, 12, size=int(flip.sum()))
        hist.append((seq.tolist(), float(rng.normal())))
    target = hist[int(rng.integers(0, 5))][0]
    native, ref = HistoryIndex.build(hist), ReferenceIndex(hist)
    nonempty = 0
    for end in range(len(target) + 1):
        context = target[:end]
        got = native.draft(context, 16).tolist()
        assert got == ref.draft(context, 16), f"position {end}"
        nonempty += bool(got)
    assert nonempty > len(target) // 2


@settings(max_examples=150, deadline=None)
@given(hist=nonempty_histories, response=st.lists(st.integers(0, 4), max_size=30), prefix=st.integers(1, 4))
def test_the_paper_similarity_bound_equals_the_reference(hist: list[Response], response: list[int], prefix: int) -> None:
    index = HistoryIndex.build(hist)
    assert index.oracle_accepted(response, prefix) == oracle_accepted(ReferenceIndex(hist), response, prefix)
