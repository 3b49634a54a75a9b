"""What the run has seen, kept for the epochs to come: the one object the step loop updates after
each step, holding both kinds of history the papers use.

- drafting (HistoSpec, RhymeRL §5): each prompt's latest epoch of responses, indexed with their
  rewards (workers/history/store.py), which the next epoch's rollout drafts from;
- lengths (HistoPipe, RhymeRL §6.1): each prompt's latest group of response lengths, which the
  rollout scheduler ranks and places by (shared with it; it does not learn them on its own here).

A resumed run rebuilds both from its dumps, so it decides what the uninterrupted run would have.
"""

from __future__ import annotations

from collections.abc import Iterable

from rhymerl.algorithms.scheduling.history import LengthHistory
from rhymerl.workers.dumps import RolloutRecord
from rhymerl.workers.history.store import MemoryHistoryStore


class RunHistory:
    def __init__(self, keep_responses: bool, reward_weighted: bool) -> None:
        self.keep_responses = keep_responses  # only history drafting reads the responses
        self.drafting = MemoryHistoryStore(reward_weighted)
        self.lengths = LengthHistory()

    def record(self, records: Iterable[RolloutRecord]) -> None:
        """A finished step (or, on resume, every dumped step in order): one group per (step, prompt)."""
        kept = list(records)
        if self.keep_responses:
            self.drafting.update(kept)
        groups: dict[tuple[int, str], list[int]] = {}
        for rec in kept:
            groups.setdefault((rec.step, rec.prompt_id), []).append(len(rec.response_ids))
        for (_, prompt_id), lengths in groups.items():
            self.lengths.observe(prompt_id, lengths)
