"""RunHistory: the one object the step loop updates after each step (drafting indexes, the recent
responses and lengths)."""

from __future__ import annotations

from rhymerl.workers.dumps import RolloutRecord
from rhymerl.workers.history.recent import RecentResponses
from rhymerl.workers.history.run_history import RunHistory
from rhymerl.workers.history.store import MemoryHistoryStore


def record(step: int, epoch: int, prompt: str, k: int, response: list[int], reward: float) -> RolloutRecord:
    return RolloutRecord(step=step, epoch=epoch, prompt_id=prompt, sample_index=k, prompt_len=1, prompt_ids=[1],
                         response_ids=response, reward=reward, finish_reason="stop", policy_version=0)


def pairs(records: list[RolloutRecord]) -> list[tuple[list[int], float]]:
    return [(r.response_ids, r.reward) for r in records]


STEP1 = [record(1, 1, "a", 0, [5, 6, 7, 8], 1.0), record(1, 1, "a", 1, [5, 6], 0.0),
         record(1, 1, "b", 0, [9] * 10, 1.0), record(1, 1, "b", 1, [9] * 6, 1.0)]
STEP2 = [record(2, 2, "a", 0, [5, 6, 7, 8, 9, 9, 9, 9], 1.0), record(2, 2, "a", 1, [5, 6, 7, 8], 0.0)]


def test_a_step_feeds_the_drafting_index_and_the_length_history() -> None:
    history = RunHistory(keep_responses=True, drafting=MemoryHistoryStore())
    history.record(STEP1)
    assert list(history.lengths.lengths("a")) == [4.0, 2.0]
    assert history.lengths.median("b") == 8.0
    drafted = history.drafting.indexes_before(2, ["a", "b"])
    assert set(drafted) == {"a", "b"}
    assert drafted["a"].draft([5, 6], max_tokens=2, prefix_max=2, prefix_min=1).tolist() == [7, 8]
    assert history.drafting.indexes_before(1, ["a"]) == {}  # an epoch drafts only from earlier ones


def test_the_next_group_of_a_prompt_replaces_its_lengths_and_sets_its_growth() -> None:
    history = RunHistory(keep_responses=False, drafting=MemoryHistoryStore())
    history.record(STEP1)
    history.record(STEP2)
    assert list(history.lengths.lengths("a")) == [8.0, 4.0]
    assert history.lengths.growth_lambda(percentile=100, floor=0.0) == 2.0  # median 3 -> 6
    assert len(history.drafting) == 0  # without history drafting nobody reads the responses


def test_replaying_every_dump_at_once_equals_recording_step_by_step() -> None:
    stepwise, replayed = RunHistory(True, MemoryHistoryStore()), RunHistory(True, MemoryHistoryStore())
    stepwise.record(STEP1)
    stepwise.record(STEP2)
    replayed.record(STEP1 + STEP2)
    for prompt in ("a", "b"):
        assert list(stepwise.lengths.lengths(prompt)) == list(replayed.lengths.lengths(prompt))
    assert stepwise.lengths.growth_lambda(100, 0.0) == replayed.lengths.growth_lambda(100, 0.0)
    assert stepwise.drafting.indexes_before(3, ["a"])["a"].to_bytes() == \
        replayed.drafting.indexes_before(3, ["a"])["a"].to_bytes()


def test_a_prompt_without_history_drafts_from_the_newest_responses_to_other_prompts() -> None:
    history = RunHistory(True, MemoryHistoryStore(), RecentResponses(budget=1000))
    assert history.indexes(1, ["a", "c"]) == {}  # nothing recorded yet: nothing to draft from
    history.record(STEP1)
    found = history.indexes(2, ["a", "c", "d"])
    assert found["a"].n_responses == 2  # its own epoch 1 first
    assert found["c"] is found["d"]  # one recent index for every prompt without its own: shipped once
    assert found["c"].n_responses == 4 and found["c"].n_tokens == 22
    assert found["c"].draft([9, 9, 9], max_tokens=3, prefix_max=3, prefix_min=1).tolist() == [9, 9, 9]
    # in the epoch being generated no prompt has an index of its own yet: all draft from the recent one
    assert set(map(id, history.indexes(1, ["a", "b"]).values())) == {id(found["c"])}


def test_the_recent_window_keeps_the_newest_whole_responses_within_its_budget() -> None:
    recent = RecentResponses(budget=12)
    recent.add(pairs(STEP1))  # 4 + 2 + 10 + 6 tokens: the newest whole ones within 12 are the 6 alone (10 + 6 > 12)
    assert [t.tolist() for t, _ in recent.window] == [[9] * 6]
    recent.add(pairs(STEP2[1:]))  # + 4
    assert recent.tokens == 10 and [len(t) for t, _ in recent.window] == [6, 4]
    recent.add([([1] * 13, 1.0)])  # longer than the budget: never kept
    assert recent.tokens == 10
    index = recent.index()
    assert index is not None and index.n_tokens == 10
    assert recent.index() is index  # built once per change
    recent.add(pairs(STEP2[:1]))  # + 8: the oldest (6) goes
    assert [len(t) for t, _ in recent.window] == [4, 8]
    assert recent.index() is not index and recent.tokens == 12


def test_no_budget_means_no_recent_index() -> None:
    history = RunHistory(True, MemoryHistoryStore(), RecentResponses(budget=0))
    history.record(STEP1)
    assert set(history.indexes(3, ["a", "b", "c"])) == {"a", "b"}


def test_a_resumed_run_keeps_the_recent_window_an_uninterrupted_run_kept() -> None:
    stepwise, replayed = (RunHistory(True, MemoryHistoryStore(), RecentResponses(budget=20)) for _ in range(2))
    stepwise.record(STEP1)
    stepwise.record(STEP2)
    replayed.record(STEP1 + STEP2)
    a, b = stepwise.indexes(3, ["c"])["c"], replayed.indexes(3, ["c"])["c"]
    assert a.to_bytes() == b.to_bytes() and a.n_tokens == 18  # 6 + 8 + 4: the 10 went


def test_an_index_of_two_epochs_drafts_from_either_and_forgets_the_third_back() -> None:
    store = MemoryHistoryStore(epochs=2)
    store.update(STEP1)  # a: [5 6 7 8], [5 6]
    store.update(STEP2)  # a: [5 6 7 8 9 9 9 9], [5 6 7 8]
    store.update([record(3, 3, "a", 0, [1, 2, 3], 1.0)])
    index = store.indexes_before(4, ["a"])["a"]
    assert index.n_responses == 3 and index.n_tokens == 15  # epochs 2 and 3
    assert index.draft([8], max_tokens=4, prefix_max=1, prefix_min=1).tolist() == [9, 9, 9, 9]  # epoch 2's
    assert index.draft([1, 2], max_tokens=1, prefix_max=2, prefix_min=1).tolist() == [3]  # epoch 3's
    one = MemoryHistoryStore(epochs=1)
    one.update(STEP1 + STEP2)  # every dump at once, as a resume records them: only the latest epoch
    assert one.indexes_before(3, ["a"])["a"].n_responses == 2


def test_replaying_every_dump_at_once_keeps_the_epochs_recording_them_one_by_one_keeps() -> None:
    stepwise, replayed = MemoryHistoryStore(epochs=2), MemoryHistoryStore(epochs=2)
    third = [record(3, 3, "a", 0, [1, 2, 3], 1.0)]
    for part in (STEP1, STEP2, third):
        stepwise.update(part)
    replayed.update(third + STEP2 + STEP1)  # in any order: epochs are indexed in their own order
    assert stepwise.indexes_before(4, ["a", "b"])["a"].to_bytes() == replayed.indexes_before(4, ["a"])["a"].to_bytes()
    assert replayed.indexes_before(4, ["b"])["b"].n_responses == 2  # b's only epoch
