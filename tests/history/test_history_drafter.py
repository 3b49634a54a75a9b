"""The batched drafter: incremental matching, AIMD windows, batching, and its guard rails."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from history_reference import ReferenceDrafter, ReferenceIndex
from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.algorithms.drafting import HistoryDrafter, HistoryIndex
from rhymerl.api.speculation import SpeculationSpec

Response = tuple[list[int], float]


def make_drafter(**knobs: float) -> HistoryDrafter:
    """A drafter with the paper's rule, any knob overridden (prefix_max=..., window_initial=..., min_prob=...),
    unvalidated, so the native guard rails are what is tested."""
    paper = SpeculationSpec.paper_rule()
    prefix = paper.prefix.model_copy(update={k[7:]: v for k, v in knobs.items() if k.startswith("prefix_")})
    window = paper.window.model_copy(update={k[7:]: v for k, v in knobs.items() if k.startswith("window_")})
    update: dict[str, object] = {"prefix": prefix, "window": window}
    if "min_prob" in knobs:
        update["min_prob"] = knobs["min_prob"]
    return HistoryDrafter(paper.model_copy(update=update))


def one(drafter: HistoryDrafter, handle: int) -> list[int]:
    offsets, tokens = drafter.draft([handle])
    return tokens[offsets[0] : offsets[1]].tolist()


def feed_one(drafter: HistoryDrafter, handle: int, tokens: list[int]) -> None:
    drafter.feed([handle], [0, len(tokens)], np.asarray(tokens, dtype=np.int32))


def mutated_history(rng: np.random.Generator, n: int, length: int, vocab: int) -> list[Response]:
    base = rng.integers(0, vocab, size=length)
    out = []
    for _ in range(n):
        seq = base.copy()
        flip = rng.random(length) < 0.08
        seq[flip] = rng.integers(0, vocab, size=int(flip.sum()))
        out.append((seq.tolist(), float(rng.integers(0, 2))))
    return out


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    prefix_min=st.integers(1, 3),
    extra=st.integers(0, 5),
    window_max=st.integers(2, 12),
    min_prob=st.sampled_from([0.0, 0.0, 0.3]),
)
def test_incremental_matching_and_aimd_equal_the_reference_along_a_whole_generation(
    seed: int, prefix_min: int, extra: int, window_max: int, min_prob: float
) -> None:
    rng = np.random.default_rng(seed)
    hist = mutated_history(rng, 4, 60, 6)
    target = mutated_history(rng, 1, 80, 6)[0][0]
    prefix_max = prefix_min + extra
    drafter = make_drafter(prefix_max=prefix_max, prefix_min=prefix_min, window_max=window_max, min_prob=min_prob)
    handle = drafter.add(HistoryIndex.build(hist))
    ref = ReferenceDrafter(ReferenceIndex(hist), prefix_max, prefix_min, 2, 2, window_max, min_prob)
    pos = 0
    while pos < len(target):  # verify drafts against the target like an engine would
        draft = one(drafter, handle)
        assert draft == ref.draft()
        accepted = 0
        while accepted < len(draft) and pos + accepted < len(target) and draft[accepted] == target[pos + accepted]:
            accepted += 1
        new = target[pos : pos + accepted + 1]
        drafter.report([handle], [accepted])
        ref.report(accepted)
        feed_one(drafter, handle, new)
        ref.feed(new)
        assert drafter.stats([handle]).window[0] == ref.window
        pos += len(new)


def test_aimd_window_grows_by_step_on_full_acceptance_and_resets_on_any_rejection() -> None:
    seq = list(range(1000, 1200))
    drafter = make_drafter(window_initial=2, window_step=2, window_max=7)
    h = drafter.add(HistoryIndex.build([(seq, 1.0)]), seq[:3])
    window = lambda: int(drafter.stats([h]).window[0])  # noqa: E731
    assert window() == 2
    pos = 3
    expected = [2, 4, 6, 7, 7]  # +2 per fully accepted draft, capped at window_max
    for w in expected:
        draft = one(drafter, h)
        assert draft == seq[pos : pos + w]
        drafter.report([h], [w])  # all accepted
        feed_one(drafter, h, seq[pos : pos + w + 1])
        pos += w + 1
    assert window() == 7
    one(drafter, h)
    drafter.report([h], [3])  # a rejection (3 of 7 accepted) resets to the initial window
    assert window() == 2
    one(drafter, h)
    drafter.report([h], [0])
    assert window() == 2


def test_window_is_unchanged_when_there_was_no_draft() -> None:
    drafter = make_drafter()
    h = drafter.add(HistoryIndex.build([([1, 2, 3, 4, 5, 6, 7, 8], 1.0)]), [1, 2, 3])
    assert one(drafter, h) == [4, 5]
    drafter.report([h], [2])
    assert drafter.stats([h]).window[0] == 4
    feed_one(drafter, h, [9, 9, 9])  # off the history: no draft
    assert one(drafter, h) == []
    drafter.report([h], [0])
    assert drafter.stats([h]).window[0] == 4


def test_batched_step_equals_per_sequence_calls() -> None:
    rng = np.random.default_rng(7)
    indexes = [HistoryIndex.build(mutated_history(rng, 4, 200, 8)) for _ in range(3)]
    n = 24
    batch, single = make_drafter(), make_drafter()
    owners = [int(rng.integers(0, 3)) for _ in range(n)]
    hb = np.array([batch.add(indexes[o]) for o in owners], dtype=np.int64)
    hs = [single.add(indexes[o]) for o in owners]
    accepted: np.ndarray | None = None
    for _ in range(40):
        counts = rng.integers(0, 5, size=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        tokens = rng.integers(0, 8, size=int(offsets[-1])).astype(np.int32)
        got_off, got_tok = batch.step(hb, offsets, tokens, accepted)
        drafts = []
        for i, h in enumerate(hs):
            if accepted is not None:
                single.report([h], [accepted[i]])
            feed_one(single, h, tokens[offsets[i] : offsets[i + 1]].tolist())
            drafts.append(one(single, h))
        assert [got_tok[got_off[i] : got_off[i + 1]].tolist() for i in range(n)] == drafts
        lengths = np.diff(got_off)
        accepted = (rng.random(n) * (lengths + 1)).astype(np.int32)
    sb, ss = batch.stats(hb), single.stats(hs)
    for field in ("window", "match_length", "drafted", "accepted", "rounds"):
        assert getattr(sb, field).tolist() == getattr(ss, field).tolist()


def test_sequences_of_different_prompts_draft_from_their_own_index() -> None:
    a = HistoryIndex.build([([1, 2, 3, 4, 4], 1.0)])
    b = HistoryIndex.build([([1, 2, 3, 5, 5], 1.0)])
    drafter = make_drafter()
    ha, hb = drafter.add(a, [1, 2, 3]), drafter.add(b, [1, 2, 3])
    offsets, tokens = drafter.draft([ha, hb, ha])
    assert offsets.tolist() == [0, 2, 4, 6]
    assert tokens.tolist() == [4, 4, 5, 5, 4, 4]


def test_report_rejects_more_accepted_than_drafted_without_changing_anything() -> None:
    drafter = make_drafter()
    h = drafter.add(HistoryIndex.build([([1, 2, 3, 4, 5, 6], 1.0)]), [1, 2, 3])
    assert one(drafter, h) == [4, 5]
    with pytest.raises(ValueError, match="outside"):
        drafter.report([h], [3])
    with pytest.raises(ValueError, match="outside"):
        drafter.report([h], [-1])
    drafter.report([h], [2])  # the failed calls left the draft pending
    assert drafter.stats([h]).window[0] == 4


def test_stale_or_unknown_handles_are_rejected() -> None:
    drafter = make_drafter()
    index = HistoryIndex.build([([1, 2, 3, 4], 1.0)])
    h = drafter.add(index)
    drafter.remove(h)
    assert len(drafter) == 0
    h2 = drafter.add(index)  # reuses the slot with a new generation
    assert h2 != h
    for bad in (h, 0, -5, 123456789):
        with pytest.raises(ValueError, match="handle"):
            drafter.draft([bad])
    with pytest.raises(ValueError, match="twice"):
        drafter.remove([h2, h2])
    assert len(drafter) == 1


def test_batched_calls_validate_shapes_before_changing_anything() -> None:
    drafter = make_drafter()
    h = drafter.add(HistoryIndex.build([([1, 2, 3, 4, 5], 1.0)]))
    with pytest.raises(ValueError, match="offsets"):
        drafter.feed([h], [0], [1])
    with pytest.raises(ValueError, match="offsets"):
        drafter.feed([h], [0, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="handle"):
        drafter.feed([h, 999], [0, 3, 3], [1, 2, 3])  # second handle bad: nothing fed to the first
    assert drafter.stats([h]).match_length[0] == 0
    with pytest.raises(ValueError, match="accepted"):
        drafter.step([h], [0, 0], np.zeros(0, dtype=np.int32), accepted=[0, 0])


def test_drafter_keeps_its_index_alive() -> None:
    drafter = make_drafter()
    h = drafter.add(HistoryIndex.build([([1, 2, 3, 4, 5], 1.0)]), [1, 2, 3])
    gc.collect()
    assert one(drafter, h) == [4, 5]


def test_drafter_reads_its_knobs_from_the_speculation_spec() -> None:
    spec = SpeculationSpec.model_validate(
        {"window": {"initial": 3, "step": 1, "max": 9}, "prefix": {"max": 5, "min": 2}, "min_prob": 0.25,
         "reward_weighted": False}
    )
    native = HistoryDrafter(spec)._native
    assert (native.prefix_max, native.prefix_min, native.min_prob) == (5, 2, 0.25)
    assert (native.window_initial, native.window_step, native.window_max) == (3, 1, 9)


def test_bad_knobs_are_rejected() -> None:
    with pytest.raises(ValueError, match="prefix_max"):
        make_drafter(prefix_max=2, prefix_min=3)
    with pytest.raises(ValueError, match="prefix_min"):
        make_drafter(prefix_min=0)
    with pytest.raises(ValueError, match="window_max"):
        make_drafter(window_initial=4, window_max=2)


def test_replaying_a_history_response_accepts_almost_all_of_it() -> None:
    rng = np.random.default_rng(3)
    hist = mutated_history(rng, 8, 400, 50)
    target = hist[2][0]
    drafter = make_drafter()
    h = drafter.add(HistoryIndex.build(hist, reward_weighted=False))
    pos, accepted_total, accepted = 0, 0, None
    while pos < len(target):
        _, toks = drafter.step([h], [0, 0], np.zeros(0, dtype=np.int32), accepted)
        draft = toks.tolist()
        a = 0
        while a < len(draft) and pos + a < len(target) and draft[a] == target[pos + a]:
            a += 1
        new = target[pos : pos + a + 1]
        drafter.report([h], [a])
        feed_one(drafter, h, new)
        accepted, pos, accepted_total = None, pos + len(new), accepted_total + a
    assert accepted_total / len(target) > 0.5
    stats = drafter.stats([h])
    assert stats.accepted[0] == accepted_total and stats.drafted[0] >= accepted_total


def test_per_sequence_caps_bound_drafts_below_the_window() -> None:
    seq = list(range(50, 90))
    drafter = make_drafter(window_initial=6, window_max=8)
    index = HistoryIndex.build([(seq, 1.0)])
    a, b = drafter.add(index, seq[:3]), drafter.add(index, seq[:3])
    offsets, tokens = drafter.draft([a, b], max_tokens=[2, 0])
    assert offsets.tolist() == [0, 2, 2] and tokens.tolist() == seq[3:5]
    drafter.report([a, b], [2, 0])
    assert drafter.stats([a, b]).window.tolist() == [8, 6]  # a's capped draft was fully accepted
    with pytest.raises(ValueError, match="negative"):
        drafter.draft([a], max_tokens=[-1])
    with pytest.raises(ValueError, match="one entry per handle"):
        drafter.draft([a, b], max_tokens=[1])


def test_step_into_writes_the_same_drafts_into_caller_buffers() -> None:
    rng = np.random.default_rng(11)
    hist = mutated_history(rng, 4, 300, 8)
    index = HistoryIndex.build(hist)
    one_, two = make_drafter(), make_drafter()
    ha = np.array([one_.add(index, hist[i][0][:50]) for i in range(3)], dtype=np.int64)
    hb = np.array([two.add(index, hist[i][0][:50]) for i in range(3)], dtype=np.int64)
    out_offsets = np.zeros(4, dtype=np.int64)
    out_tokens = np.zeros(3 * 32, dtype=np.int32)
    feed = np.asarray([hist[i][0][50] for i in range(3)], dtype=np.int32)
    offsets = np.arange(4, dtype=np.int64)
    total = two.step_into(hb, offsets, feed, None, out_offsets, out_tokens, max_tokens=[5, 5, 1])
    want_offsets, want_tokens = one_.step(ha, offsets, feed, None, max_tokens=[5, 5, 1])
    assert out_offsets.tolist() == want_offsets.tolist() and total == want_offsets[-1]
    assert out_tokens[:total].tolist() == want_tokens.tolist()
    with pytest.raises(ValueError, match="room"):
        two.step_into(hb, [0, 0, 0, 0], np.zeros(0, dtype=np.int32), None, out_offsets, out_tokens[:10])
    with pytest.raises(TypeError, match="int32"):
        two.step_into(hb, [0, 0, 0, 0], np.zeros(0, dtype=np.int32), None, out_offsets, out_tokens.astype(np.int64))


def test_threads_can_drive_one_drafter_concurrently() -> None:
    import threading

    rng = np.random.default_rng(5)
    hist = mutated_history(rng, 4, 2000, 16)
    index = HistoryIndex.build(hist)
    shared, alone = make_drafter(), make_drafter()
    groups = [[shared.add(index) for _ in range(8)] for _ in range(4)]
    solo = [[alone.add(index) for _ in range(8)] for _ in range(4)]
    feeds = [rng.integers(0, 16, size=(50, 8, 3)).astype(np.int32) for _ in range(4)]
    results: dict[int, list[list[int]]] = {}

    def drive(g: int, drafter: HistoryDrafter, handles: list[int], out: dict[int, list[list[int]]]) -> None:
        got = []
        for step in range(50):
            offsets, tokens = drafter.step(handles, np.arange(0, 25, 3), feeds[g][step].ravel())
            got.append(tokens.tolist() + offsets.tolist())
        out[g] = got

    threads = [threading.Thread(target=drive, args=(g, shared, groups[g], results)) for g in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected: dict[int, list[list[int]]] = {}
    for g in range(4):
        drive(g, alone, solo[g], expected)
    assert results == expected
