"""RunHistory: the one object the step loop updates after each step (drafting index and lengths)."""

from __future__ import annotations

from rhymerl.workers.dumps import RolloutRecord
from rhymerl.workers.history.run_history import RunHistory
from rhymerl.workers.history.store import MemoryHistoryStore


def record(step: int, epoch: int, prompt: str, k: int, response: list[int], reward: float) -> RolloutRecord:
    return RolloutRecord(step=step, epoch=epoch, prompt_id=prompt, sample_index=k, prompt_len=1, prompt_ids=[1],
                         response_ids=response, reward=reward, finish_reason="stop", policy_version=0)


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
