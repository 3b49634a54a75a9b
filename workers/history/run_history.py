"""What the run has seen, kept for the epochs to come: the one object the step loop updates after
each step, holding both kinds of history the papers use.

- drafting (HistoSpec, RhymeRL §5): each prompt's latest epoch of responses, indexed with their
  rewards, in memory or in Redis (`history.store`; workers/history/), which the next epoch's
  rollout drafts from;
- lengths (HistoPipe, RhymeRL §6.1): each prompt's latest group of response lengths, which the
  rollout scheduler ranks and places by (shared with it; it does not learn them on its own here).

A resumed run rebuilds both from its dumps, so it decides what the uninterrupted run would have.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from rhymerl.algorithms.scheduling.history import LengthHistory
from rhymerl.api import RLJob
from rhymerl.api.history_keys import LOCAL_NAMESPACE, REDIS_PASSWORD_ENV, history_key_prefix
from rhymerl.workers.dumps import RolloutRecord
from rhymerl.workers.history.redis_store import RedisHistoryStore
from rhymerl.workers.history.store import HistoryStore, MemoryHistoryStore


class RunHistory:
    def __init__(self, keep_responses: bool, drafting: HistoryStore) -> None:
        self.keep_responses = keep_responses  # only history drafting reads the responses
        self.drafting = drafting
        self.lengths = LengthHistory()

    @classmethod
    def for_job(cls, job: RLJob) -> RunHistory:
        """The store `history.store` names. A Redis store starts empty: whatever an earlier process
        of this job left there is deleted, and a resumed run refills it from its dumps (the run
        folder is the record; steps after its checkpoint run again), so no epoch is kept twice."""
        spec, speculation = job.spec.history, job.spec.rollout.speculation
        store: HistoryStore
        if spec.store == "redis":
            assert spec.redis_url is not None
            prefix = history_key_prefix(job.metadata.namespace or LOCAL_NAMESPACE, job.metadata.name)
            redis_store = RedisHistoryStore.connect(spec.redis_url, prefix, speculation.reward_weighted,
                                                    password=os.environ.get(REDIS_PASSWORD_ENV) or None)
            redis_store.clear()
            store = redis_store
        else:
            store = MemoryHistoryStore(speculation.reward_weighted)
        return cls(keep_responses=speculation.method == "history", drafting=store)

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
