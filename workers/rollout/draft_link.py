"""The verifier's link to a drafter on another rollout worker (rollout/remote_drafts.py): what goes
over it, and the link to a drafter in this process. Records and a Protocol only, no torch, so the
transports that carry a link (controller/transport.py, runtime/ray_draft_link.py) and the role APIs
import no model code."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class News:
    """What the verifier tells the drafter of one sequence: the first time its whole context (`prompt`:
    the prompt and what it generated so far), then the tokens it emitted since the last message, or
    that it ended."""

    seq: int
    tokens: tuple[int, ...] = ()
    prompt: tuple[int, ...] | None = None
    ended: bool = False


@dataclass(frozen=True)
class DraftStream:
    """Tokens predicted to follow the first `base` tokens (prompt and response) of sequence `seq`."""

    seq: int
    base: int
    tokens: tuple[int, ...]


class DraftLink(Protocol):
    """The verifier's end of its link to a drafter: one message outstanding at a time."""

    def send(self, news: Sequence[News]) -> None:
        """Send news (nothing waits for the reply)."""

    def poll(self) -> list[DraftStream] | None:
        """The reply to the last send once it has come (each reply once); None while it has not.
        Raises if the drafter is gone."""

    def close(self) -> None:
        """The verifier is done with the drafter (it frees what it held for this link)."""


@dataclass
class LocalDraftLink:
    """A link to a drafter in this process: the reply is made as the news is sent (the in-process
    fleet steps its workers in turn, so its runs repeat exactly), and read at the next pass. The
    drafting runs in the verifier's turn, so its time counts on the verifier's clock, not beside it."""

    drafter: Any  # the RolloutWorker that drafts
    link: Hashable
    _reply: list[DraftStream] | None = None

    def send(self, news: Sequence[News]) -> None:
        self._reply = self.drafter.exchange(self.link, list(news))

    def poll(self) -> list[DraftStream] | None:
        reply, self._reply = self._reply, None
        return reply

    def close(self) -> None:
        self.drafter.drop_link(self.link)
