"""The group index (the current step's sibling responses, grown token by token) against a brute-force
reference, and how the drafter chooses between it and the history index."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.algorithms.drafting import GroupIndex, HistoryDrafter, HistoryIndex
from rhymerl.api.speculation import DraftPrefixSpec, DraftWindowSpec, SpeculationSpec

DEPTH = 5
WINDOW = 6


def _spec(min_prob: float) -> SpeculationSpec:
    return SpeculationSpec(prefix=DraftPrefixSpec(max=3, min=1), window=DraftWindowSpec(initial=WINDOW, step=2, max=WINDOW),
                           min_prob=min_prob)


def _count(seqs: list[list[int]], s: tuple[int, ...]) -> int:
    """Occurrences of s in all sequences (the index keeps strings of at most DEPTH tokens)."""
    if len(s) > DEPTH:
        return 0
    return sum(1 for q in seqs for end in range(len(s), len(q) + 1) if tuple(q[end - len(s): end]) == s)


def _reference(seqs: list[list[int]], me: int, min_prob: float) -> list[int]:
    ctx = seqs[me]
    for k in range(min(3, len(ctx), DEPTH), 0, -1):
        node = tuple(ctx[len(ctx) - k:])
        nexts = {q[e]: 0 for q in seqs for e in range(len(q)) if tuple(q[max(0, e - k): e]) == node and e >= k}
        if any(_count(seqs, (*node, t)) for t in nexts):
            break
    else:
        return []
    out: list[int] = []
    prob = 1.0
    while len(out) < WINDOW:
        alphabet = {t for q in seqs for t in q}
        counts = {t: _count(seqs, (*node, t)) for t in alphabet}
        total = sum(counts.values())
        if total == 0:
            break
        best = min(counts, key=lambda t: (-counts[t], t))
        prob *= counts[best] / total
        if min_prob > 0 and prob < min_prob:
            break
        out.append(best)
        node = (*node, best)
    return out


@settings(max_examples=60, deadline=None)
@given(seqs=st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=1, max_size=4),
       order_seed=st.integers(0, 2**16), min_prob=st.sampled_from([0.0, 0.4]))
def test_siblings_fed_in_any_interleaving_draft_what_a_brute_force_count_drafts(
        seqs: list[list[int]], order_seed: int, min_prob: float) -> None:
    drafter = HistoryDrafter(_spec(min_prob))
    group = GroupIndex(DEPTH)
    handles = [drafter.add(None, group=group) for _ in seqs]
    turns = [i for i, q in enumerate(seqs) for _ in q]
    np.random.default_rng(order_seed).shuffle(turns)
    fed = [0] * len(seqs)
    for i in turns:  # one token at a time, siblings interleaved
        drafter.feed([handles[i]], [0, 1], [seqs[i][fed[i]]])
        fed[i] += 1
    offsets, tokens = drafter.draft(handles)
    for i in range(len(seqs)):
        assert tokens[offsets[i]: offsets[i + 1]].tolist() == _reference(seqs, i, min_prob)
    assert group.n_tokens == sum(map(len, seqs))


@settings(max_examples=60, deadline=None)
@given(seqs=st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=2, max_size=4),
       cuts_seed=st.integers(0, 2**16))
def test_siblings_heard_in_chunks_draft_as_if_they_were_generated_here(seqs: list[list[int]], cuts_seed: int) -> None:
    """Sequence 0 is generated here; the others arrive through feeds, each in random chunks, the
    feeds interleaved: the draft is the brute-force count's over all of them."""
    drafter = HistoryDrafter(_spec(0.0))
    group = GroupIndex(DEPTH)
    mine = drafter.add(None, seqs[0], group=group)
    rng = np.random.default_rng(cuts_seed)
    feeds = [group.follow() for _ in seqs[1:]]
    queues = [np.array_split(np.array(q, dtype=np.int32), int(rng.integers(1, 4))) for q in seqs[1:]]
    while any(queues):  # the feeds interleaved, each feed's chunks in order
        k = int(rng.integers(len(feeds)))
        if queues[k]:
            feeds[k].append(queues[k].pop(0))
    _, tokens = drafter.draft([mine])
    assert tokens.tolist() == _reference(seqs, 0, 0.0)
    assert [f.fed for f in feeds] == [len(q) for q in seqs[1:]]
    assert group.n_tokens == sum(map(len, seqs))


def test_the_source_with_the_longer_match_drafts() -> None:
    drafter = HistoryDrafter(SpeculationSpec(prefix=DraftPrefixSpec(max=4, min=1), min_prob=0.0))
    history = HistoryIndex.build([([1, 2, 3, 4, 7, 7], 1.0)])
    group = GroupIndex(8)
    group.extend([9, 2, 3, 4, 8, 8])
    group.extend([5, 3, 4, 6, 6])
    long_history = drafter.add(history, [1, 2, 3, 4], group=group)   # history matches 4 tokens, group 3
    long_group = drafter.add(history, [9, 2, 3, 4], group=group)     # group 4 (its own tokens excluded), history 3
    offsets, tokens = drafter.draft([long_history, long_group])
    assert tokens[offsets[0]: offsets[1]].tolist() == [7, 7]
    assert tokens[offsets[1]: offsets[2]].tolist() == [8, 8]


def test_on_equal_matches_the_longer_draft_wins() -> None:
    drafter = HistoryDrafter(SpeculationSpec(prefix=DraftPrefixSpec(max=2, min=1), window=DraftWindowSpec(initial=4, max=4),
                                             min_prob=0.0))
    history = HistoryIndex.build([([3, 4, 7], 1.0)])  # one token after "3 4"
    group = GroupIndex(8)
    group.extend([3, 4, 8, 8, 8])
    h = drafter.add(history, [3, 4], group=group)
    _, tokens = drafter.draft([h])
    assert tokens.tolist() == [8, 8, 8]
