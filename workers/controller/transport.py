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

import functools
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Concatenate, Generic, ParamSpec, Protocol, TypeVar, cast, overload

from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api import RLJob
from rhymerl.api.roles import Role
from rhymerl.workers.controller.role_apis import (
    RolloutAPI,
    RolloutItem,
    Weights,
    WeightsRef,
    concurrency_group,
)
from rhymerl.workers.roles.samples import (
    CallState,
    Handback,
    HandbackTag,
    OutputTag,
    ProgressTag,
    RolloutCall,
    RolloutOutput,
    RolloutProgress,
    StateTag,
)
from rhymerl.workers.rollout.draft_link import DraftLink, LocalDraftLink

P = ParamSpec("P")
A = TypeVar("A")
W = TypeVar("W")
R = TypeVar("R")
R1 = TypeVar("R1")
R2 = TypeVar("R2")
A_co = TypeVar("A_co", covariant=True)
R_co = TypeVar("R_co", covariant=True)


class WorkerGone(Exception):
    """The worker behind a call or stream died (its process, or the pod it ran on)."""


class ResultLost(Exception):
    """An object a call needed or made died with the worker that held it."""


class Handle(Generic[A_co]):
    """A role worker as the step loop holds it, typed by what it answers (an API of role_apis.py, or
    the worker class itself); each transport's own subclass says how to reach it."""


class Result(Generic[R_co]):
    """What a call returns at once: read it with `Transport.get`, or hand it to another worker's call
    with `Transport.arg`. Each transport's own subclass holds a value or a reference."""


@dataclass(eq=False)
class Stream:
    """One rollout call's reports as they come (each transport's subclass holds its source)."""

    handle: Handle[RolloutAPI]
    call_id: int
    opened: int = 0  # order of opening (a worker runs its calls in that order)


@dataclass(frozen=True)
class StateReport:
    """A call's token counts."""

    stream: Stream
    state: CallState


@dataclass(frozen=True)
class ProgressReport:
    """A call's token counts and a snapshot of every sample's tokens (what a re-run resumes from)."""

    stream: Stream
    state: CallState
    progress: Result[RolloutProgress]


@dataclass(frozen=True)
class HandbackReport:
    """Samples a call handed back, and their tokens."""

    stream: Stream
    handback: Handback
    progress: Result[RolloutProgress]


@dataclass(frozen=True)
class OutputReport:
    """A call's last report: its token counts and its output."""

    stream: Stream
    state: CallState
    output: Result[RolloutOutput]


Report = StateReport | ProgressReport | HandbackReport | OutputReport
"""What the step loop hears of a rollout call: its tag (samples.Tag) and, where the tag has one, the
item before it, typed as the tag says (the value itself in this process, a reference on Ray)."""


class Items(Protocol):
    def __call__(self, kind: type[R]) -> Result[R]:
        """The item before a tag as a result of `kind`, the type its tag says it is (on Ray a
        reference, nothing fetched)."""


def report_of(stream: Stream, tag: object, item: Items) -> Report:
    """The report of a tag read from `stream` (TypeError for anything else)."""
    match tag:
        case StateTag(state):
            return StateReport(stream, state)
        case ProgressTag(state):
            return ProgressReport(stream, state, item(RolloutProgress))
        case HandbackTag(handback):
            return HandbackReport(stream, handback, item(RolloutProgress))
        case OutputTag(state):
            return OutputReport(stream, state, item(RolloutOutput))
    raise TypeError(f"not a rollout stream's tag: {tag!r}")


Indexes = Mapping[str, HistoryIndex]


def known(result: Result[R | None]) -> Result[R]:
    """A result its caller knows is not None (a train step that kept groups made new weights): unchecked
    until read, as a reference on Ray cannot be looked into without fetching it."""
    return cast(Result[R], result)


class Transport(Protocol):
    concurrent: bool
    """Role workers run beside each other (scoring overlaps rollout, rollout may run ahead of training)."""

    def start(self, role: Role, cls: Callable[P, W], *args: P.args, **kwargs: P.kwargs) -> Handle[W]:
        """A new worker of `role`, `cls(*args, **kwargs)`; its handle."""

    def start_lead(self, role: Role, cls: Callable[P, W], *args: P.args, **kwargs: P.kwargs) -> Handle[W]:
        """As `start`, on the role's lead pod (the train pod whose volume holds the run's checkpoints)."""

    def ready(self, handle: Handle[object]) -> bool:
        """Whether a worker being started answers yet (raises WorkerGone if it died starting)."""

    def stop(self, handle: Handle[object]) -> None:
        """Stop a worker for good."""

    def call(self, handle: Handle[A], method: Callable[Concatenate[A, P], R], *args: P.args,
             **kwargs: P.kwargs) -> Result[R]:
        """Call `method` (of the handle's API) on the worker; its result."""

    def call2(self, handle: Handle[A], method: Callable[Concatenate[A, P], tuple[R1, R2]], *args: P.args,
              **kwargs: P.kwargs) -> tuple[Result[R1], Result[R2]]:
        """Call a method that returns a pair; each half a result of its own (one may be read, or
        passed on, without the other)."""

    def tell(self, handle: Handle[A], method: Callable[Concatenate[A, P], object], *args: P.args,
             **kwargs: P.kwargs) -> None:
        """Call a method whose result nobody reads (in order with the worker's other calls, or beside
        a running call for those in a concurrency group, role_apis.py)."""

    def draft_link(self, drafter: Handle[RolloutAPI], link: Hashable) -> DraftLink:
        """A link a rollout worker's call verifies drafts through, to rollout worker `drafter`, named
        `link` (freed drafters, rollout/remote_drafts.py); it travels to the verifier in a call."""

    def get(self, result: Result[R], timeout: float | None = None) -> R:
        """The value behind a result; raises WorkerGone, ResultLost, TimeoutError, or what the call raised."""

    def done(self, result: Result[object]) -> bool:
        """Whether a result is there (nothing waits)."""

    @overload
    def arg(self, value: Result[R]) -> R: ...
    @overload
    def arg(self, value: R) -> R: ...
    def arg(self, value: R | Result[R]) -> R:
        """A value, or a result, as an argument of a call: the worker gets the value (on Ray the
        reference itself travels, resolved before the call runs; only as a direct argument)."""

    def wait_alive(self, handle: Handle[object]) -> None:
        """Until a worker that died and is being restarted answers again (raises WorkerGone if it
        does not come back)."""

    def stream(self, handle: Handle[RolloutAPI], call_id: int, call: RolloutCall,
               indexes: Indexes | Result[Indexes] | None, resume: RolloutProgress | Result[RolloutProgress] | None,
               ) -> Stream:
        """Open rollout call `call_id` on a rollout worker (`RolloutAPI.generate`)."""

    def next_report(self, streams: Sequence[Stream], timeout: float) -> Report | None:
        """The next report of any of `streams` (None if none came within `timeout`); raises
        WorkerGone for a stream whose worker died, naming it (`exc.args[0]` is the Stream)."""

    def keep(self, item: Result[R]) -> Result[R]:
        """`item` made to outlive the worker that made it (a leaving worker's handback)."""

    def deferred(self, weights: Weights | Result[Weights]) -> Weights | WeightsRef:
        """Weights passed on to a worker unresolved: the worker resolves them (`.get()`) only if it
        needs them. In this process: the value itself."""

    def clock(self, handle: Handle[object]) -> float:
        """Seconds on the worker's clock (comparable between workers)."""

    def catch_up(self, handle: Handle[object], to: Handle[object]) -> None:
        """A worker handed work by `to` cannot start it before `to`'s clock."""

    def sync(self, handles: Sequence[Handle[object]]) -> float:
        """A round starts: the workers' clocks from here on are comparable; the round's start on them."""

    def capacity(self, role: Role) -> int | None:
        """How many workers of `role` fit in all (None: no limit)."""


def pipelined(job: RLJob, t: Transport) -> bool:
    """Rollout runs ahead of training: an off-policy bound of at least one version, on a transport
    whose workers run beside the step loop."""
    return job.spec.algorithm.max_off_policy_steps >= 1 and t.concurrent


@dataclass(eq=False)
class _Value(Result[R]):
    value: R


@dataclass(eq=False)
class _Pending(Result[R]):
    """A call in this process that waits behind a rollout call its worker is running."""

    name: str
    run: Callable[[], R]
    value: R | None = None
    done: bool = False

    def finish(self) -> None:
        self.value, self.done = self.run(), True


@dataclass(eq=False)
class _Local(Handle[A_co]):
    obj: A_co
    clock: float = 0.0
    stopped: bool = False
    queue: list[_LocalStream | Callable[[], None]] = field(default_factory=list)  # calls, in the order made


@dataclass(eq=False)
class _LocalStream(Stream):
    run: Callable[[], Iterator[RolloutItem]] | None = None  # opens the generator when its turn comes
    source: Iterator[RolloutItem] | None = None


def _checked(value: RolloutItem) -> Items:
    """A stream's item in this process, checked to be what its tag says."""
    def item(kind: type[R]) -> Result[R]:
        if not isinstance(value, kind):
            raise TypeError(f"a tag for a {kind.__name__} after a {type(value).__name__}")
        return _Value(value)
    return item


def _local(handle: Handle[A]) -> _Local[A]:
    if not isinstance(handle, _Local):
        raise TypeError(f"not a handle of LocalTransport: {handle!r}")
    return handle


@dataclass
class LocalTransport:
    """Every role worker in this process (module docstring). A worker does one thing at a time, in
    order, as a Ray actor does: a call made while it runs a rollout call waits for that call to
    end (but for the requests that reach a running call: release, admit, leave)."""

    concurrent: bool = False
    _opened: int = 0
    _turn: int = 0  # where the round-robin over workers resumes

    def start(self, role: Role, cls: Callable[P, W], *args: P.args, **kwargs: P.kwargs) -> Handle[W]:
        return _Local(cls(*args, **kwargs))

    def start_lead(self, role: Role, cls: Callable[P, W], *args: P.args, **kwargs: P.kwargs) -> Handle[W]:
        return _Local(cls(*args, **kwargs))

    def ready(self, handle: Handle[object]) -> bool:
        return True

    def stop(self, handle: Handle[object]) -> None:
        local = _local(handle)
        local.stopped = True
        close = getattr(local.obj, "close", None)
        if callable(close):
            close()

    def call(self, handle: Handle[A], method: Callable[Concatenate[A, P], R], *args: P.args,
             **kwargs: P.kwargs) -> Result[R]:
        local = _local(handle)
        bound: Callable[P, R] = getattr(local.obj, method.__name__)  # the worker's own, not the API's stub
        if concurrency_group(method) == "control" or not any(isinstance(e, Stream) for e in local.queue):
            return _Value(bound(*args, **kwargs))
        pending: _Pending[R] = _Pending(method.__name__, functools.partial(bound, *args, **kwargs))
        local.queue.append(pending.finish)
        return pending

    def call2(self, handle: Handle[A], method: Callable[Concatenate[A, P], tuple[R1, R2]], *args: P.args,
              **kwargs: P.kwargs) -> tuple[Result[R1], Result[R2]]:
        pair = self.call(handle, method, *args, **kwargs)
        return _Half(pair, 0), _Half(pair, 1)

    def tell(self, handle: Handle[A], method: Callable[Concatenate[A, P], object], *args: P.args,
             **kwargs: P.kwargs) -> None:
        self.call(handle, method, *args, **kwargs)

    def draft_link(self, drafter: Handle[RolloutAPI], link: Hashable) -> DraftLink:
        return LocalDraftLink(_local(drafter).obj, link)

    def get(self, result: Result[R], timeout: float | None = None) -> R:
        if isinstance(result, _Value):
            return cast(R, result.value)
        if isinstance(result, _Half):
            return cast(R, self.get(result.pair)[result.index])
        if isinstance(result, _Pending):
            if not result.done:
                raise RuntimeError(f"{result.name}: waits behind its worker's rollout call")
            return cast(R, result.value)
        raise TypeError(f"not a result of LocalTransport: {result!r}")

    def done(self, result: Result[object]) -> bool:
        if isinstance(result, _Half):
            return self.done(result.pair)
        return not isinstance(result, _Pending) or result.done

    @overload
    def arg(self, value: Result[R]) -> R: ...
    @overload
    def arg(self, value: R) -> R: ...
    def arg(self, value: R | Result[R]) -> R:
        return self.get(value) if isinstance(value, Result) else value

    def wait_alive(self, handle: Handle[object]) -> None:
        """A worker in this process does not die and come back."""

    def stream(self, handle: Handle[RolloutAPI], call_id: int, call: RolloutCall,
               indexes: Indexes | Result[Indexes] | None, resume: RolloutProgress | Result[RolloutProgress] | None,
               ) -> Stream:
        local = _local(handle)
        self._opened += 1
        args = (call, self.arg(indexes), self.arg(resume))
        stream = _LocalStream(handle, call_id, self._opened, lambda: local.obj.generate(*args))
        local.queue.append(stream)
        return stream

    def next_report(self, streams: Sequence[Stream], timeout: float) -> Report | None:
        """The workers in turn, one report each; a worker's calls in the order they were made."""
        heads = []
        for handle in {id(s.handle): _local(s.handle) for s in streams}.values():
            head = self._head(handle)
            if head is not None and head in streams:
                heads.append(head)
        if not heads:
            return None
        order = sorted(heads, key=lambda s: s.opened)
        stream = order[self._turn % len(order)]
        self._turn += 1
        local = _local(stream.handle)
        t0 = time.perf_counter()
        if stream.source is None:
            assert stream.run is not None, "a rollout stream read after its output"
            stream.source, stream.run = iter(stream.run()), None
        item = next(stream.source)
        report = report_of(stream, next(stream.source), _checked(item))
        local.clock += time.perf_counter() - t0
        if isinstance(report, OutputReport):  # the call's end: its generator (and the KV cache in its frame) goes now
            stream.source.close()  # type: ignore[attr-defined]  # a generator
            stream.source = None
            local.queue.remove(stream)
            self._head(local)
        return report

    @staticmethod
    def _head(local: _Local[object]) -> _LocalStream | None:
        """Run the calls waiting at the front of the worker's queue; the rollout call it runs next."""
        while local.queue:
            head = local.queue[0]
            if isinstance(head, _LocalStream):
                return head
            local.queue.pop(0)
            head()
        return None

    def keep(self, item: Result[R]) -> Result[R]:
        return item

    def deferred(self, weights: Weights | Result[Weights]) -> Weights | WeightsRef:
        return self.arg(weights)

    def clock(self, handle: Handle[object]) -> float:
        return float(_local(handle).clock)

    def catch_up(self, handle: Handle[object], to: Handle[object]) -> None:
        local = _local(handle)
        local.clock = max(local.clock, _local(to).clock)

    def sync(self, handles: Sequence[Handle[object]]) -> float:
        locals_ = [_local(h) for h in handles]
        start = max((h.clock for h in locals_), default=0.0)
        for h in locals_:
            h.clock = start
        return start

    def capacity(self, role: Role) -> int | None:
        return None


@dataclass(eq=False)
class _Half(Result[R]):
    """One half of a pair a call returned, in this process."""

    pair: Result[tuple[object, object]]
    index: int
