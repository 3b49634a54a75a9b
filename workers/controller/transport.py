"""How the step loop reaches its role workers: the seam between the one step loop and fleet and
the two ways to run them.

`LocalTransport` runs every role worker in this process: a call is a method call, a rollout
call's stream is its generator, stepped one report at a time, the workers in turn (so the order
of events, and every decision made from them, repeats exactly), and each worker's clock is the
time its own calls took. Nothing runs beside anything else (`concurrent` False).

The Ray transport (workers/runtime/ray_transport.py) runs each role worker as a Ray actor: a call
returns references, a stream is Ray's streaming generator, clocks are the wall clock, and workers
die (`WorkerGone`) and leave objects behind that died with them (`ResultLost`).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rhymerl.api import RLJob
from rhymerl.api.roles import Role
from rhymerl.workers.roles.rollout_worker import RolloutWorker
from rhymerl.workers.rollout.remote_drafts import DraftLink, LocalDraftLink


class WorkerGone(Exception):
    """The worker behind a call or stream died (its process, or the pod it ran on)."""


class ResultLost(Exception):
    """An object a call needed or made died with the worker that held it."""


@dataclass
class Stream:
    """One rollout call's reports as they come."""

    handle: Any
    call_id: int
    source: Any  # the transport's own: a generator, or Ray's ObjectRefGenerator
    opened: int = 0  # order of opening (a worker runs its calls in that order)


@dataclass(frozen=True)
class Report:
    stream: Stream
    kind: str  # the tag: state, progress, handback, output (roles/samples.py Tag)
    value: Any  # the tag's value (small)
    item: Any  # the item before the tag: itself in this process, a reference on Ray


class Transport(Protocol):
    concurrent: bool
    """Role workers run beside each other (scoring overlaps rollout, rollout may run ahead of training)."""

    def start(self, role: Role, cls: type, *args: Any, lead: bool = False) -> Any:
        """A new worker of `role` (an instance of `cls` built with `args`); its handle. `lead`: on
        the role's lead pod (the train pod whose volume holds the run's checkpoints)."""

    def ready(self, handle: Any) -> bool:
        """Whether a worker being started answers yet (raises WorkerGone if it died starting)."""

    def stop(self, handle: Any) -> None:
        """Stop a worker for good."""

    def call(self, handle: Any, method: str, *args: Any, returns: int = 1) -> Any:
        """Call a method; its result (a tuple of `returns` results when > 1), or references to them."""

    def tell(self, handle: Any, method: str, *args: Any) -> None:
        """Call a method whose result nobody reads (in order with the worker's other calls, or beside
        a running call for those in its control group)."""

    def draft_link(self, drafter: Any, link: Hashable) -> DraftLink:
        """A link a rollout worker's call verifies drafts through, to rollout worker `drafter`, named
        `link` (freed drafters, rollout/remote_drafts.py); it travels to the verifier in a call."""

    def get(self, result: Any, timeout: float | None = None) -> Any:
        """The value behind a result; raises WorkerGone, ResultLost, TimeoutError, or what the call raised."""

    def done(self, result: Any) -> bool:
        """Whether a result is there (nothing waits)."""

    def wait_alive(self, handle: Any) -> None:
        """Until a worker that died and is being restarted answers again (raises WorkerGone if it
        does not come back)."""

    def stream(self, handle: Any, call_id: int, *args: Any) -> Stream:
        """Open rollout call `call_id` on a rollout worker (`RolloutWorker.generate(*args)`)."""

    def next_report(self, streams: Sequence[Stream], timeout: float) -> Report | None:
        """The next report of any of `streams` (None if none came within `timeout`); raises
        WorkerGone for a stream whose worker died, naming it (`exc.args[0]` is the Stream)."""

    def keep(self, item: Any) -> Any:
        """`item` made to outlive the worker that made it (a leaving worker's handback)."""

    def deferred(self, result: Any) -> Any:
        """A result passed on to a worker unresolved: the worker resolves it (`.get()`) only if it
        needs it. In this process: the value itself."""

    def clock(self, handle: Any) -> float:
        """Seconds on the worker's clock (comparable between workers)."""

    def catch_up(self, handle: Any, to: Any) -> None:
        """A worker handed work by `to` cannot start it before `to`'s clock."""

    def sync(self, handles: Sequence[Any]) -> float:
        """A round starts: the workers' clocks from here on are comparable; the round's start on them."""

    def capacity(self, role: Role) -> int | None:
        """How many workers of `role` fit in all (None: no limit)."""


def pipelined(job: RLJob, t: Transport) -> bool:
    """Rollout runs ahead of training: an off-policy bound of at least one version, on a transport
    whose workers run beside the step loop."""
    return job.spec.algorithm.max_off_policy_steps >= 1 and t.concurrent


@dataclass
class _Pending:
    """A call in this process that waits behind a rollout call its worker is running."""

    method: str
    args: tuple[Any, ...]
    value: Any = None
    done: bool = False


@dataclass
class _Local:
    obj: Any
    clock: float = 0.0
    stopped: bool = False
    queue: list[Stream | _Pending] = field(default_factory=list)  # in the order they were made


@dataclass
class LocalTransport:
    """Every role worker in this process (module docstring). A worker does one thing at a time, in
    order, as a Ray actor does: a call made while it runs a rollout call waits for that call to
    end (but for the requests that reach a running call: release, admit, leave)."""

    concurrent: bool = False
    _opened: int = 0
    _turn: int = 0  # where the round-robin over workers resumes

    def start(self, role: Role, cls: type, *args: Any, lead: bool = False) -> Any:
        return _Local(cls(*args))

    def ready(self, handle: Any) -> bool:
        return True

    def stop(self, handle: Any) -> None:
        handle.stopped = True
        close = getattr(handle.obj, "close", None)
        if callable(close):
            close()

    def call(self, handle: Any, method: str, *args: Any, returns: int = 1) -> Any:
        if method in RolloutWorker.CONTROL or not any(isinstance(e, Stream) for e in handle.queue):
            return getattr(handle.obj, method)(*args)
        pending = _Pending(method, args)
        handle.queue.append(pending)
        return pending

    def tell(self, handle: Any, method: str, *args: Any) -> None:
        self.call(handle, method, *args)

    def draft_link(self, drafter: Any, link: Hashable) -> DraftLink:
        return LocalDraftLink(drafter.obj, link)

    def get(self, result: Any, timeout: float | None = None) -> Any:
        if isinstance(result, _Pending):
            if not result.done:
                raise RuntimeError(f"{result.method}: waits behind its worker's rollout call")
            return result.value
        return result

    def done(self, result: Any) -> bool:
        return not isinstance(result, _Pending) or result.done

    def wait_alive(self, handle: Any) -> None:
        """A worker in this process does not die and come back."""

    def stream(self, handle: Any, call_id: int, *args: Any) -> Stream:
        self._opened += 1
        stream = Stream(handle, call_id, (args, None), self._opened)  # the generator: made when its turn comes
        handle.queue.append(stream)
        return stream

    def next_report(self, streams: Sequence[Stream], timeout: float) -> Report | None:
        """The workers in turn, one report each; a worker's calls in the order they were made."""
        heads = []
        for handle in {id(s.handle): s.handle for s in streams}.values():
            head = self._head(handle)
            if head is not None and head in streams:
                heads.append(head)
        if not heads:
            return None
        order = sorted(heads, key=lambda s: s.opened)
        stream = order[self._turn % len(order)]
        self._turn += 1
        t0 = time.perf_counter()
        args, source = stream.source
        if source is None:
            source = iter(stream.handle.obj.generate(*args))
            stream.source = (args, source)
        item = next(source)
        kind, value = next(source)
        stream.handle.clock += time.perf_counter() - t0
        if kind == "output":  # the call's end: its generator (and the KV cache in its frame) goes now
            source.close()
            stream.source = None
            stream.handle.queue.remove(stream)
            self._head(stream.handle)
        return Report(stream, kind, value, item)

    @staticmethod
    def _head(handle: Any) -> Stream | None:
        """Run the calls waiting at the front of the worker's queue; the rollout call it runs next."""
        while handle.queue and isinstance(handle.queue[0], _Pending):
            pending = handle.queue.pop(0)
            pending.value, pending.done = getattr(handle.obj, pending.method)(*pending.args), True
        return handle.queue[0] if handle.queue else None

    def keep(self, item: Any) -> Any:
        return item

    def deferred(self, result: Any) -> Any:
        return result

    def clock(self, handle: Any) -> float:
        return float(handle.clock)

    def catch_up(self, handle: Any, to: Any) -> None:
        handle.clock = max(handle.clock, to.clock)

    def sync(self, handles: Sequence[Any]) -> float:
        start = max((h.clock for h in handles), default=0.0)
        for h in handles:
            h.clock = start
        return start

    def capacity(self, role: Role) -> int | None:
        return None
