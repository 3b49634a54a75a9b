"""What the run has seen, kept for the epochs to come: the one object the step loop updates after
each step, holding both kinds of history the papers use.

- drafting (HistoSpec, RhymeRL §5): each prompt's latest epochs of responses
  (`speculation.history_epochs`), indexed with their rewards, in memory or in Redis
  (`history.store`; workers/history/), which the next epoch's rollout drafts from, and the run's
  newest responses to any prompt (recent.py, kept in memory), which prompts without such an epoch
  draft from;
- lengths (HistoPipe, RhymeRL §6.1): each prompt's latest group of response lengths, which the
  rollout scheduler ranks and places by (shared with it; it does not learn them on its own here).

A resumed run rebuilds both from its dumps, so it decides what the uninterrupted run would have.

In Redis a run keeps its drafting history under its own prefix (rhymerl.api.history_keys): the run id
is made when the run first needs it and kept in its run folder (RUN_ID_FILE), so a resume, or a
controller pod restarted on its data volume, finds its own keys, and two runs of one job never meet.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.algorithms.scheduling.history import LengthHistory
from rhymerl.api import RLJob
from rhymerl.api.history_keys import LOCAL_NAMESPACE, REDIS_PASSWORD_ENV, RUN_ID, run_key_prefix
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers import atomic
from rhymerl.workers.dumps import RolloutRecord
from rhymerl.workers.history.recent import RecentResponses
from rhymerl.workers.history.redis_store import RedisHistoryStore
from rhymerl.workers.history.store import HistoryStore, MemoryHistoryStore

RUN_ID_FILE = "history-run-id"


def new_run_id() -> str:
    return secrets.token_hex(6)


def history_run_id(job: RLJob, run_folder: Path) -> str | None:
    """The run's id in its Redis keys, read from its run folder or made there (whole, or not at all) on
    first use; None for a job whose history is not in Redis (its folder gets no file)."""
    if job.spec.history.store != "redis":
        return None
    path = run_folder / RUN_ID_FILE
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if RUN_ID.match(kept):
        return kept
    made = new_run_id()
    atomic.write_text(path, made + "\n")
    return made


class RunHistory:
    def __init__(self, keep_responses: bool, drafting: HistoryStore, recent: RecentResponses | None = None) -> None:
        self.keep_responses = keep_responses  # only history drafting reads the responses
        self.drafting = drafting
        self.recent = recent
        self.lengths = LengthHistory()

    @classmethod
    def for_job(cls, job: RLJob, run_id: str) -> RunHistory:
        """The store `history.store` names. A Redis store starts empty: whatever an earlier process
        of this run left under its prefix is deleted, and a resumed run refills it from its dumps (the
        run folder is the record; steps after its checkpoint run again), so no epoch is kept twice.
        Other runs' keys, of this job or another, are not touched."""
        spec, speculation = job.spec.history, job.spec.rollout.speculation
        if spec.store != "redis":
            return cls.in_memory(speculation)
        assert spec.redis_url is not None
        prefix = run_key_prefix(job.metadata.namespace or LOCAL_NAMESPACE, job.metadata.name, run_id)
        store = RedisHistoryStore.connect(spec.redis_url, prefix, speculation.reward_weighted,
                                          password=os.environ.get(REDIS_PASSWORD_ENV) or None,
                                          epochs=speculation.history_epochs)
        store.clear()
        return cls(keep_responses=speculation.reads_history, drafting=store, recent=cls._recent(speculation))

    @classmethod
    def in_memory(cls, speculation: SpeculationSpec) -> RunHistory:
        """The history a job keeps with `history.store: memory` (the benchmarks replay runs through it)."""
        store = MemoryHistoryStore(speculation.reward_weighted, speculation.history_epochs)
        return cls(keep_responses=speculation.reads_history, drafting=store, recent=cls._recent(speculation))

    @staticmethod
    def _recent(speculation: SpeculationSpec) -> RecentResponses | None:
        return RecentResponses(speculation.recent_tokens, speculation.reward_weighted) \
            if speculation.reads_history and speculation.recent_tokens else None

    def record(self, records: Iterable[RolloutRecord]) -> None:
        """A finished step (or, on resume, every dumped step in order): one group per (step, prompt)."""
        kept = list(records)
        if self.keep_responses:
            self.drafting.update(kept)
        if self.recent is not None:
            self.recent.add((r.response_ids, r.reward) for r in kept)
        groups: dict[tuple[int, str], list[int]] = {}
        for rec in kept:
            groups.setdefault((rec.step, rec.prompt_id), []).append(len(rec.response_ids))
        for (_, prompt_id), lengths in groups.items():
            self.lengths.observe(prompt_id, lengths)

    def indexes(self, epoch: int, prompt_ids: Iterable[str]) -> dict[str, HistoryIndex]:
        """What each prompt drafts from in `epoch`: its own index of an earlier epoch, else the recent
        responses' (one object for all such prompts, so it is shipped once)."""
        ids = list(prompt_ids)
        found = self.drafting.indexes_before(epoch, ids)
        recent = self.recent.index() if self.recent is not None else None
        if recent is not None:
            found.update({pid: recent for pid in ids if pid not in found})
        return found

    def close(self) -> None:
        """The run is done with its history: a Redis store deletes its run's keys (a resume refills them from
        the dumps) and closes its connection."""
        if isinstance(self.drafting, RedisHistoryStore):
            self.drafting.close(clear=True)
