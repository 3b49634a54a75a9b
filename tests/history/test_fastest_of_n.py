"""Fastest-of-N: the per-request choice (pure) and the engine's Fastest-of-N replayed by the benches."""

from __future__ import annotations

import numpy as np
import pytest

from rhymerl.algorithms.drafting import HistoryIndex
from rhymerl.algorithms.drafting.fastest_of_n import SourceChoice, costly_pays, matched, told_accepted
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.tools.bench.draft_replay import replay_units
from rhymerl.tools.bench.draft_sources import fastest_of_n, histospec
from rhymerl.tools.bench.draft_workloads import PromptWork


def test_matched_counts_the_leading_draft_tokens_the_emitted_tokens_confirm() -> None:
    assert matched([1, 2, 3], [1, 2, 9]) == 2
    assert matched([1, 2], [1]) == 1
    assert matched([], [5]) == 0
    assert matched([4], [5, 4]) == 0


def test_a_source_choice_follows_the_decayed_confirmed_tokens_and_breaks_ties_to_the_first_source() -> None:
    choice = SourceChoice(2, 2, decay=0.5)
    assert choice.choose().tolist() == [0, 0]
    choice.observe(np.array([[1, 2], [3, 0]]))  # scores [[0.5, 1.0], [1.5, 0.0]]
    assert choice.choose().tolist() == [1, 0]
    choice.observe(np.array([[4, 0]]), rows=np.array([0]))  # row 0: [0.25 + 2.0, 0.5 + 0.0]
    assert choice.scores[0].tolist() == [2.25, 0.5]
    assert choice.choose().tolist() == [0, 0]
    choice.reset(0)
    assert choice.scores[0].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="decay"):
        SourceChoice(1, 2, decay=1.0)
    with pytest.raises(ValueError, match="sources"):
        SourceChoice(1, 0)


def _unit(seed: int) -> PromptWork:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 40, size=300).astype(np.int32)
    history = [(base.copy(), 1.0), (base.copy(), 0.0)]
    targets = []
    for _ in range(4):
        t = base.copy()
        flip = rng.random(t.size) < 0.05
        t[flip] = rng.integers(0, 40, size=int(flip.sum()))
        targets.append(t)
    return PromptWork(f"p{seed}", np.zeros(0, dtype=np.int32), history, targets, epoch=1)


def test_fastest_of_n_over_one_source_twice_replays_exactly_as_that_source() -> None:
    units = [_unit(0), _unit(1)]
    knobs = SpeculationSpec()
    indexes = [HistoryIndex.build(u.history) for u in units]
    alone = replay_units(histospec(indexes, knobs), units)
    both = fastest_of_n([histospec(indexes, knobs, name="a"), histospec(indexes, knobs, name="b")], knobs)
    twice = replay_units(both, units)
    assert (twice.generated, twice.accepted, twice.drafted, twice.verify_steps) == (
        alone.generated, alone.accepted, alone.drafted, alone.verify_steps)
    assert "b" not in both.served and both.served["a"] > 0  # equal scores: the first source


def test_fastest_of_n_moves_each_request_to_the_source_whose_drafts_its_tokens_confirm() -> None:
    units = [_unit(2)]
    knobs = SpeculationSpec()
    good = [HistoryIndex.build(units[0].history)]
    useless = [HistoryIndex.build([(np.full(50, 99, dtype=np.int32), 1.0)])]  # never continues a target
    alone = replay_units(histospec(good, knobs), units)
    fastest = fastest_of_n([histospec(useless, knobs, name="useless"), histospec(good, knobs, name="good")], knobs)
    got = replay_units(fastest, units)
    assert "useless" not in fastest.served and fastest.served["good"] > 0
    assert got.accepted >= alone.accepted - 2 * len(units[0].targets)  # a pass or two per request to switch


def test_a_source_choice_takes_the_best_source_that_offers_a_draft_and_keeps_scores_through_moves() -> None:
    choice = SourceChoice(3, 3)
    choice.scores[:] = [[3.0, 2.0, 1.0], [3.0, 2.0, 1.0], [0.0, 0.0, 0.0]]
    offered = np.array([[False, True, True], [False, False, False], [False, False, True]])
    # row 0: the best source has no draft, the next best has; row 1: nobody offers, the best stays
    assert choice.choose(offered=offered).tolist() == [1, 0, 2]
    choice.resize(5)
    assert choice.scores.shape == (5, 3) and choice.scores[0].tolist() == [3.0, 2.0, 1.0]
    choice.move(np.array([0]), np.array([4]))
    assert choice.scores[4].tolist() == [3.0, 2.0, 1.0]


def test_a_source_is_told_its_whole_draft_was_accepted_unless_the_emitted_tokens_refute_it() -> None:
    assert told_accepted([1, 2, 3, 4], [1, 2]) == 4      # checked as far as it could be: not refuted
    assert told_accepted([1, 2, 3, 4], [1, 9]) == 1      # refuted at its second token
    assert told_accepted([1, 2], [1, 2, 7]) == 2         # all of it confirmed
    assert told_accepted([], [5]) == 0


def test_a_costly_source_pays_when_its_tokens_per_second_beat_the_pass_without_it() -> None:
    # a pass of 10 tokens in 1 s: 10 tokens/s. 3 more tokens for 0.2 s more: 13 / 1.2 = 10.8 tokens/s
    assert costly_pays(gain=3.0, tokens=10.0, pass_s=1.0, draft_s=0.2)
    # 1 more token for 0.2 s more: 11 / 1.2 = 9.2 tokens/s
    assert not costly_pays(gain=1.0, tokens=10.0, pass_s=1.0, draft_s=0.2)
    assert not costly_pays(gain=0.0, tokens=10.0, pass_s=1.0, draft_s=0.0)  # nothing gained: not asked
