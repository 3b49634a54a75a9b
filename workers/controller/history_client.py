"""The step loop's side of the history worker: indexes for each rollout call, each step's groups
recorded, and a history worker (or its Redis) that cannot serve costs speculation, never the run.

A history worker that cannot answer within HISTORY_WAIT_S, or whose store (Redis) fails, leaves that
call without drafts (the round's `history_ok` is false; events.log says so once, whether an index or
a record failed first, and once more when it serves again); one that died for good (its store was
down when it started) is replaced, so drafting comes back with the store. Every history worker this
client starts is refilled from the train worker's dumps before its first index, by a call given the
train worker's result: a history worker never holds the train worker's handle, whose unpickling on
Ray would load the train worker's class, and torch with it, into the history worker's process.
Drafts never change tokens, so none of this changes the run's samples.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from rhymerl.workers import dumps
from rhymerl.workers.controller.role_apis import HistoryAPI
from rhymerl.workers.controller.transport import Handle, Indexes, Result, Transport, WorkerGone
from rhymerl.workers.roles.groups import StepLayout
from rhymerl.workers.roles.samples import ScoredSample
from rhymerl.workers.run_folder.loop_state import LoopState

HISTORY_WAIT_S = 10.0


Dumped = list[dumps.RolloutRecord]


class HistoryClient:
    def __init__(self, transport: Transport, start: Callable[[], Handle[HistoryAPI]],
                 dumped: Callable[[], Dumped | Result[Dumped]], note: Callable[[str], None]) -> None:
        """`start` starts a history worker; `dumped` asks for every response dumped so far (the train
        worker's `history_records`), which each one started is refilled from."""
        self.transport, self._start, self._dumped, self.note = transport, start, dumped, note
        self.handle: Handle[HistoryAPI] | None = None
        self.down: str | None = None  # why it cannot serve, while it cannot
        self.pending: list[tuple[int, Result[int]]] = []
        self.restart(0)

    def restart(self, step: int) -> None:
        try:
            self.handle = self._start()
            refilled = self.transport.call(self.handle, HistoryAPI.refill, self.transport.arg(self._dumped()))
            self.pending.append((step, refilled))  # runs before its first index; a failure is noted as a record's
        except Exception as exc:  # a store that is down when the worker starts (in this process)
            self.handle = None
            self._failed(step, _why(exc))

    def indexes(self, epoch: int, prompt_ids: list[str], step: int) -> Result[Indexes] | None:
        """The history worker's indexes of these prompts, or None if it cannot serve them in
        HISTORY_WAIT_S."""
        if self.handle is None:
            self.restart(step)
            if self.handle is None:
                return None
        try:
            found, served = self.transport.call2(self.handle, HistoryAPI.indexes, epoch, prompt_ids, step)
            self.transport.get(served, timeout=HISTORY_WAIT_S)
        except TimeoutError:
            self._failed(step, f"no answer within {HISTORY_WAIT_S:.0f}s")
            return None
        except WorkerGone as exc:
            self._failed(step, str(exc) or "it died")
            self.restart(step)
            return None
        except Exception as exc:  # its store failed (Redis down): the call raised
            self._failed(step, _why(exc))
            return None
        if self.down is not None:
            self.note(f"step {step}: the history worker serves indexes again")
        self.down = None
        return found

    def _failed(self, step: int, problem: str, doing: str = "serve indexes") -> None:
        if self.down is None:
            self.note(f"step {step}: the history worker cannot {doing} ({problem}); rolling out without "
                      "history drafts until it can")
        self.down = problem

    def record(self, step: int, state: LoopState, layout: StepLayout,
               *scored: list[ScoredSample] | Result[list[ScoredSample]]) -> None:
        """Record a step's groups (`HistoryAPI.record`); its outcome is checked later."""
        if self.handle is None:
            return
        try:
            passed = [self.transport.arg(s) for s in scored]
            self.pending.append((step, self.transport.call(self.handle, HistoryAPI.record, state, layout, *passed)))
        except Exception as exc:  # in this process the call runs at once: its store failed
            self._failed(step, _why(exc), "record the step")

    def check_records(self) -> None:
        """A step whose history could not be recorded (its prompts draft nothing next epoch) counts as the
        worker being down: noted once, as a failed index is."""
        still = []
        for step, result in self.pending:
            if not self.transport.done(result):
                still.append((step, result))
                continue
            try:
                self.transport.get(result)
            except Exception as exc:
                self._failed(step, _why(exc), "record the step")
        self.pending = still

    def stop(self) -> None:
        """The run is done with its history worker: it deletes its run's Redis keys (HistoryWorker.close;
        a resume refills them), then it goes; one that cannot answer goes all the same."""
        if self.handle is None:
            return
        with contextlib.suppress(Exception):  # best effort: the run's next start, or the RLJob's finalizer, deletes them
            self.transport.get(self.transport.call(self.handle, HistoryAPI.close), timeout=HISTORY_WAIT_S)
        self.transport.stop(self.handle)
        self.handle = None


def _why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
