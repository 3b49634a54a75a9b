"""A call's group indexes hearing siblings generated on other workers: in order, repeated, past a
gap, only for the call's own prompts."""

from __future__ import annotations

from rhymerl.algorithms.drafting import GroupIndex
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.rollout.group_drafts import GroupDrafts, GrownTokens

SPEC = SpeculationSpec()


def _extended(*responses: list[int]) -> GroupIndex:
    group = GroupIndex.for_spec(SPEC)
    for r in responses:
        group.extend(r)
    return group


def _block(*rows: tuple[int, str, int, list[int]]) -> GrownTokens:
    """(sample id, prompt, start, tokens) per sample, all of epoch 1."""
    block = GrownTokens.of((1, sid, prompt, start, tokens) for sid, prompt, start, tokens in rows)
    assert block is not None
    return block


def test_a_sibling_heard_in_pieces_is_indexed_as_one_response() -> None:
    groups = GroupDrafts(SPEC, ["p"])
    groups.hear([_block((7, "p", 0, [1, 2, 3]))])
    groups.hear([_block((7, "p", 3, [4, 5]))])
    whole = _extended([1, 2, 3, 4, 5])
    assert (groups.index("p").n_tokens, groups.index("p").n_nodes) == (whole.n_tokens, whole.n_nodes) == (5, 16)
    assert (groups.heard, groups.gaps) == (5, 0)


def test_tokens_heard_twice_are_indexed_once() -> None:
    groups = GroupDrafts(SPEC, ["p"])
    groups.hear([_block((7, "p", 0, [1, 2, 3]))])
    groups.hear([_block((7, "p", 1, [2, 3, 4]))])  # a report repeated from position 1
    groups.hear([_block((7, "p", 0, [1]))])  # nothing new
    whole = _extended([1, 2, 3, 4])
    assert (groups.index("p").n_tokens, groups.index("p").n_nodes) == (whole.n_tokens, whole.n_nodes)
    assert (groups.heard, groups.gaps) == (4, 0)


def test_tokens_past_a_gap_are_indexed_as_a_response_of_their_own() -> None:
    groups = GroupDrafts(SPEC, ["p"])
    groups.hear([_block((7, "p", 0, [1, 2]))])
    groups.hear([_block((7, "p", 5, [7, 8]))])  # positions 2-4 never heard
    apart, joined = _extended([1, 2], [7, 8]), _extended([1, 2, 7, 8])
    assert groups.index("p").n_nodes == apart.n_nodes != joined.n_nodes
    assert (groups.heard, groups.gaps) == (4, 1)


def test_only_the_calls_own_prompts_siblings_are_indexed_each_in_its_prompts_group() -> None:
    groups = GroupDrafts(SPEC, ["a", "b"])
    groups.hear([_block((1, "a", 0, [1, 2, 3]), (2, "b", 0, [4, 5]), (9, "z", 0, [6, 6])), _block((3, "a", 0, [6]))])
    assert {p: g.n_tokens for p, g in groups.indexes.items()} == {"a": 4, "b": 2}
    assert groups.heard == 6


def test_a_message_of_several_blocks_indexes_each_sibling_after_its_own_past() -> None:
    one_by_one, at_once = GroupDrafts(SPEC, ["a", "b"]), GroupDrafts(SPEC, ["a", "b"])
    message = [_block((1, "a", 0, [1, 2, 3]), (2, "a", 0, [1, 2, 4])), _block((1, "a", 3, [5])),
               _block((2, "a", 2, [4, 6]), (3, "b", 4, []))]
    for m in message:
        one_by_one.hear([m])
    at_once.hear(message)
    assert {p: (g.n_tokens, g.n_nodes) for p, g in at_once.indexes.items()} == \
        {p: (g.n_tokens, g.n_nodes) for p, g in one_by_one.indexes.items()} == \
        {"a": (8, _extended([1, 2, 3, 5], [1, 2, 4, 6]).n_nodes), "b": (0, 1)}
    assert (at_once.heard, at_once.gaps) == (8, 0)


def test_a_block_names_its_samples_groups_and_none_is_made_of_nothing() -> None:
    block = GrownTokens.of([(1, 11, "a", 0, [1, 2]), (2, 12, "a", 5, []), (1, 13, "b", 3, [7])])
    assert block is not None
    assert block.groups == {(1, "a"), (2, "a"), (1, "b")}
    assert block.offsets.tolist() == [0, 2, 2, 3] and block.tokens.tolist() == [1, 2, 7]
    assert GrownTokens.of([]) is None
