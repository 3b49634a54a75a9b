"""History stores (the protocol both follow) and the in-memory one of the local backend: per
prompt, the index of its latest epoch. The Redis store is redis_store.py.

Indexes are kept as serialised bytes, exactly what a history worker ships to rollout workers or
puts in Redis, so the local path exercises the same format. A prompt's index for epoch e is built
from all its responses of epoch e - 1 (with their rewards).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.workers.dumps import RolloutRecord


class HistoryStore(Protocol):
    """Where each prompt's latest epoch of responses is kept, indexed, for the next epoch to draft from."""

    def update(self, records: Iterable[RolloutRecord]) -> None: ...

    def indexes_before(self, epoch: int, prompt_ids: Iterable[str]) -> dict[str, HistoryIndex]: ...


class MemoryHistoryStore:
    def __init__(self, reward_weighted: bool = False) -> None:
        self.reward_weighted = reward_weighted
        self._blobs: dict[str, tuple[int, bytes]] = {}  # prompt id -> (epoch of its responses, index)

    def update(self, records: Iterable[RolloutRecord]) -> None:
        """Index every prompt's responses of one epoch; a later epoch replaces an earlier one."""
        groups: dict[tuple[str, int], list[RolloutRecord]] = {}
        for rec in records:
            groups.setdefault((rec.prompt_id, rec.epoch), []).append(rec)
        for (pid, epoch), recs in groups.items():
            current = self._blobs.get(pid)
            if current is not None and current[0] > epoch:
                continue
            if current is not None and current[0] == epoch:
                raise ValueError(f"prompt {pid}: epoch {epoch} indexed twice")
            index = HistoryIndex.build(((r.response_ids, r.reward) for r in recs),
                                       reward_weighted=self.reward_weighted)
            self._blobs[pid] = (epoch, index.to_bytes())

    def indexes_before(self, epoch: int, prompt_ids: Iterable[str]) -> dict[str, HistoryIndex]:
        """Indexes of the given prompts built from an epoch earlier than `epoch`."""
        out = {}
        for pid in prompt_ids:
            entry = self._blobs.get(pid)
            if entry is not None and entry[0] < epoch:
                out[pid] = HistoryIndex.from_bytes(entry[1])
        return out

    def __len__(self) -> int:
        return len(self._blobs)
