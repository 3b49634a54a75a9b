"""A verifier's link to a drafter that is another Ray actor (freed drafters, rollout/remote_drafts.py):
news go as a call in the drafter's drafts group, and the reply is taken only once it is there."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from rhymerl.workers.rollout.draft_link import DraftStream, News


@dataclass
class RayDraftLink:
    drafter: Any  # the drafting RolloutWorker's actor handle
    link: Hashable
    _reply: Any = None  # the outstanding call's reference

    def send(self, news: Sequence[News]) -> None:
        self._reply = self.drafter.exchange.options(concurrency_group="drafts").remote(self.link, list(news))

    def poll(self) -> list[DraftStream] | None:
        if self._reply is None or not ray.wait([self._reply], timeout=0)[0]:
            return None
        reply, self._reply = self._reply, None
        streams: list[DraftStream] = ray.get(reply)  # a dead drafter raises: the verifier drops the link
        return streams

    def close(self) -> None:
        self.drafter.drop_link.options(concurrency_group="drafts").remote(self.link)
