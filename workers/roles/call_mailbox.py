"""What a running rollout call hears between its passes: the step loop's requests (release, admit,
leave, draft_from, hear) arrive on other threads (beside the call, in its concurrency group on Ray)
and wait here until the call's next pass collects them, so an engine never shares its state with them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from rhymerl.workers.roles.samples import RolloutProgress, SampleRef
from rhymerl.workers.rollout.draft_link import DraftLink
from rhymerl.workers.rollout.generation import GenRequest, GenResult
from rhymerl.workers.rollout.group_drafts import GrownTokens

Admitted = tuple[SampleRef, GenRequest, GenResult | None]


@dataclass
class Mail:
    """The requests that arrived since the call's last pass."""

    release: set[SampleRef] = field(default_factory=set)  # samples to hand back with their tokens
    admitted: list[Admitted] = field(default_factory=list)  # samples to join the call, with what they have
    leaving: bool = False  # hand every unfinished sample back: the worker leaves the fleet
    link: list[DraftLink | None] = field(default_factory=list)  # a drafter link to switch to (None: nobody's)
    heard: list[GrownTokens] = field(default_factory=list)  # siblings' tokens from other workers


class CallMailbox:
    """The running call's requests, kept under one lock; a request for a call that already ended is
    ignored (the step loop may ask after the call's end crossed its request)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._call: int | None = None
        self._max_prompt = 0  # the running call's longest prompt: what its KV cache was sized for
        self._mail = Mail()

    @property
    def leaving(self) -> bool:
        return self._mail.leaving

    @property
    def idle(self) -> bool:
        return self._call is None

    def open(self, call: int, max_prompt: int) -> None:
        """`call` runs from now on, and admits samples whose prompts are at most `max_prompt` long
        (0: it admits none)."""
        with self._lock:
            self._call, self._max_prompt = call, max_prompt
            self._mail = Mail(leaving=self._mail.leaving)

    def collect(self) -> Mail:
        """The requests since the last collection (a notice to leave stays in force)."""
        with self._lock:
            mail = self._mail
            self._mail = Mail(leaving=mail.leaving)
            return mail

    def close_unless_admitted(self) -> bool:
        """End the running call unless samples were admitted to it since the last collection."""
        with self._lock:
            if self._mail.admitted:
                return False
            self._call = None
            return True

    def close(self) -> None:
        with self._lock:
            self._call = None

    def notice(self) -> bool:
        """A notice to leave (SIGTERM); whether no call is running (nothing to hand back)."""
        with self._lock:
            self._mail.leaving = True
            return self._call is None

    def release(self, call: int, samples: Sequence[SampleRef]) -> None:
        with self._lock:
            if self._call == call:
                self._mail.release.update(samples)

    def admit(self, call: int, samples: list[SampleRef], requests: list[GenRequest],
              partials: RolloutProgress | None) -> bool:
        with self._lock:
            if self._call != call or self._mail.leaving or max(len(r.prompt_ids) for r in requests) > self._max_prompt:
                return False
            results = partials.results if partials is not None else {}
            self._mail.admitted += [(s, r, results.get(s)) for s, r in zip(samples, requests, strict=True)]
            return True

    def leave(self) -> None:
        with self._lock:
            self._mail.leaving = True

    def draft_from(self, call: int, link: DraftLink | None) -> None:
        with self._lock:
            if self._call == call:
                self._mail.link = [link]

    def hear(self, call: int, blocks: list[GrownTokens]) -> None:
        with self._lock:
            if self._call == call:
                self._mail.heard += blocks
