"""History stores (the protocol both follow) and the in-memory one of the local backend: per
prompt, the index of its latest epoch. The Redis store is redis_store.py.

Indexes are kept as serialised bytes, exactly what a history worker ships to rollout workers or
puts in Redis, so the local path exercises the same format. A prompt's index for epoch e is built
from all its responses of epochs e - K .. e - 1 (with their rewards; K = `speculation.history_epochs`,
RhymeRL's is 1): the responses of the K - 1 epochs before the newest are kept for the next build.
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


Response = tuple[list[int], float]


def grouped(records: Iterable[RolloutRecord]) -> list[tuple[tuple[str, int], list[RolloutRecord]]]:
    """Records by (prompt, epoch), earlier epochs first (a resumed run records every dump at once)."""
    groups: dict[tuple[str, int], list[RolloutRecord]] = {}
    for rec in records:
        groups.setdefault((rec.prompt_id, rec.epoch), []).append(rec)
    return sorted(groups.items(), key=lambda item: item[0][1])


class MemoryHistoryStore:
    def __init__(self, reward_weighted: bool = False, epochs: int = 1) -> None:
        """epochs: how many of a prompt's latest epochs its index holds (`speculation.history_epochs`)."""
        if epochs < 1:
            raise ValueError(f"epochs {epochs}: must be >= 1")
        self.reward_weighted = reward_weighted
        self.epochs = epochs
        self._blobs: dict[str, tuple[int, bytes]] = {}  # prompt id -> (newest epoch of its responses, index)
        self._older: dict[str, dict[int, list[Response]]] = {}  # the epochs the next index still holds

    def update(self, records: Iterable[RolloutRecord]) -> None:
        """Index every prompt's responses of one epoch with those of its `epochs - 1` epochs before it;
        a later epoch replaces the index."""
        for (pid, epoch), recs in grouped(records):
            current = self._blobs.get(pid)
            if current is not None and current[0] > epoch:
                continue
            if current is not None and current[0] == epoch:
                raise ValueError(f"prompt {pid}: epoch {epoch} indexed twice")
            kept = {e: rs for e, rs in self._older.get(pid, {}).items() if e > epoch - self.epochs}
            kept[epoch] = [(r.response_ids, r.reward) for r in recs]
            index = HistoryIndex.build((r for e in sorted(kept) for r in kept[e]), reward_weighted=self.reward_weighted)
            self._blobs[pid] = (epoch, index.to_bytes())
            self._older[pid] = {e: rs for e, rs in kept.items() if e > epoch + 1 - self.epochs}

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
