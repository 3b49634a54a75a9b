"""The Redis history store, against a real redis-server: what it keeps, under which keys, and that a
run drafting from it makes the same tokens as one drafting from memory."""

from __future__ import annotations

import asyncio

import pytest
import redis

from rhymerl.api.history_keys import history_key_prefix
from rhymerl.operator.reconcile.history import delete_history
from rhymerl.workers.dumps import RolloutRecord
from rhymerl.workers.history.redis_store import HistoryStoreError, RedisHistoryStore
from rhymerl.workers.history.store import MemoryHistoryStore


def record(epoch: int, prompt: str, k: int, response: list[int], reward: float) -> RolloutRecord:
    return RolloutRecord(step=epoch, epoch=epoch, prompt_id=prompt, sample_index=k, prompt_len=1, prompt_ids=[1],
                         response_ids=response, reward=reward, finish_reason="stop", policy_version=0)


EPOCH1 = [record(1, "p0", 0, [5, 6, 7, 8, 9], 1.0), record(1, "p0", 1, [5, 6, 2], 0.0),
          record(1, "p1", 0, list(range(300, 700)), 1.0), record(1, "p1", 1, [], 0.0)]


def store(url: str, job: str = "job-a") -> RedisHistoryStore:
    return RedisHistoryStore.connect(url, history_key_prefix("team", job))


def test_responses_rewards_and_lengths_come_back_as_written(redis_url: str) -> None:
    s = store(redis_url)
    s.update(EPOCH1)
    assert s.responses("p0", 1) == ([[5, 6, 7, 8, 9], [5, 6, 2]], [1.0, 0.0])
    assert s.responses("p1", 1)[0] == [list(range(300, 700)), []]
    assert s.lengths("p1", 1).tolist() == [400, 0]
    assert s.responses("p0", 2) == ([], [])


def test_its_indexes_are_the_memory_stores_byte_for_byte(redis_url: str) -> None:
    s, memory = store(redis_url), MemoryHistoryStore()
    s.update(EPOCH1)
    memory.update(EPOCH1)
    got, want = s.indexes_before(2, ["p0", "p1", "p9"]), memory.indexes_before(2, ["p0", "p1", "p9"])
    assert sorted(got) == sorted(want) == ["p0", "p1"]
    assert all(got[p].to_bytes() == want[p].to_bytes() for p in got)
    assert s.indexes_before(1, ["p0"]) == {}  # an epoch drafts only from earlier ones


def test_an_index_of_several_epochs_is_the_memory_stores_byte_for_byte(redis_url: str) -> None:
    s = RedisHistoryStore.connect(redis_url, history_key_prefix("team", "job-a"), epochs=2)
    memory = MemoryHistoryStore(epochs=2)
    later = [record(2, "p0", 0, [7, 7, 7], 1.0), record(3, "p0", 0, [4, 4], 0.0), record(3, "p1", 0, [3], 1.0)]
    for st in (s, memory):
        st.update(EPOCH1)
        st.update(later[:1])  # epoch by epoch, as a run records them
        st.update(later[1:])
    got, want = s.indexes_before(4, ["p0", "p1"]), memory.indexes_before(4, ["p0", "p1"])
    assert got["p0"].to_bytes() == want["p0"].to_bytes() and got["p1"].to_bytes() == want["p1"].to_bytes()
    assert got["p0"].n_responses == 2  # epochs 2 and 3; epoch 1 went
    assert got["p1"].n_responses == 1  # epoch 3 alone: its epoch 1 is older than epochs 2-3 (none in epoch 2)


@pytest.mark.parametrize("epochs", [1, 2, 3])
def test_responses_no_later_index_reads_are_deleted_with_the_write_that_outdates_them(redis_url: str,
                                                                                      epochs: int) -> None:
    s = RedisHistoryStore.connect(redis_url, history_key_prefix("team", "job-a"), epochs=epochs)
    client = redis.Redis.from_url(redis_url)
    for epoch in (1, 3, 4):  # a prompt may skip an epoch
        s.update([record(epoch, "p0", 0, [epoch] * 3, 1.0)])
    kept = sorted(int(k.decode().rsplit(":", 1)[1]) for k in client.keys("*responses:p0:*"))
    assert kept == {1: [4], 2: [4], 3: [3, 4]}[epochs]  # what an index of epoch 5 reads, and epoch 4's own
    s.update([record(5, "p0", 0, [5], 1.0)])
    assert s.indexes_before(6, ["p0"])["p0"].n_responses == {1: 1, 2: 2, 3: 3}[epochs]  # epochs 5 | 4-5 | 3-5


def test_a_later_epoch_replaces_the_index_and_an_epoch_is_never_indexed_twice(redis_url: str) -> None:
    s = store(redis_url)
    s.update(EPOCH1)
    s.update([record(2, "p0", 0, [7, 7, 7], 1.0)])
    assert s.indexes_before(3, ["p0"])["p0"].n_responses == 1
    s.update([record(1, "p0", 0, [1], 1.0)])  # older than what is kept: ignored
    assert s.indexes_before(3, ["p0"])["p0"].n_responses == 1
    with pytest.raises(ValueError, match="epoch 2 indexed twice"):
        s.update([record(2, "p0", 1, [8], 0.0)])
    assert len(s) == 2


def test_every_key_is_under_the_jobs_prefix_and_the_operators_cleanup_removes_exactly_them(redis_url: str) -> None:
    a, b = store(redis_url, "job-a"), store(redis_url, "job-ab")  # one prefix must not cover the other
    a.update(EPOCH1)
    b.update(EPOCH1)
    client = redis.Redis.from_url(redis_url)
    keys = sorted(k.decode() for k in client.keys("*"))
    assert all(k.startswith(("rhymerl:team:job-a:", "rhymerl:team:job-ab:")) for k in keys) and len(keys) == 8
    assert asyncio.run(delete_history(redis_url, "team", "job-a")) == 4
    assert len(a) == 0 and len(b) == 2
    assert b.clear() == 4 and client.keys("*") == []


def test_an_unreachable_redis_is_one_line_naming_the_url() -> None:
    with pytest.raises(HistoryStoreError, match=r"history.redis_url redis://127.0.0.1:1/0: ConnectionError"):
        RedisHistoryStore.connect("redis://127.0.0.1:1/0", "rhymerl:x:y:", timeout_s=1.0)
