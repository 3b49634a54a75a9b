"""Reward scoring: a user's function runs in worker processes, so it cannot take the run down.

A user reward function is code we do not control: it may raise, hang, return a string, call
`sys.exit` or crash the interpreter. `RewardPool` runs it in `reward.workers` processes, one call
per worker at a time, each under `reward.timeout_s`; whatever happens, every sample of a batch gets
exactly one `Outcome`, in input order (outcome.py says which results count as failures):

- raised: "raised ValueError: bad"; the worker goes on.
- hung: "timed out after 10 s"; the worker is killed and replaced, the other calls go on.
- returned something else: "returned 'abc' (str), not a number", "returned nan".
- the worker died (sys.exit, os._exit, a segfault): "worker exited with code 0 while scoring",
  "worker was killed by SIGSEGV while scoring"; it is replaced. Only the call it was running fails:
  the samples not yet handed out go to the other workers.

Workers run the function in their main thread, so verifiers that time themselves out with
`signal.alarm` (math-verify) work. They are started with the `spawn` method: the controller has
torch loaded, with its thread pools running, and `fork` would copy a process whose threads may hold
locks (deadlocks in the child; torch does not support fork after its threads start), while a
`forkserver` keeps the `sys.path` of the moment it started. A spawned worker is a fresh interpreter
that gets the controller's current `sys.path` and imports only the reward module, once per worker
(about 0.3 s, while the model loads); as with any spawn-based pool, a script that drives the loop
must guard its entry point with `if __name__ == "__main__":`. Workers are daemons that ignore
Ctrl-C (the controller handles it and closes the pool) and exit when the controller's process
ends, even by SIGKILL.

The built-in verifier (`final-answer`) is our own code: a few string operations that cannot
fail, hang or exit, and cost less than sending the sample to a process. It runs in-process
(`InProcess`), with no workers started.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from rhymerl.workers.reward.outcome import Outcome, judge, raised
from rhymerl.workers.reward.verifiers import BUILTIN, RewardError, RewardFn, load_user_function

if TYPE_CHECKING:
    from rhymerl.api.services import RewardSpec

Sample = tuple[str, str, str] | tuple[str, str, str, dict[str, Any]]
"""(prompt, response, answer[, extras]): the arguments of one reward call; `extras` (a row's
`data_source`/`extra_info`) go as keyword arguments to a function that names them or takes **kwargs."""

_CLOSE_GRACE_S = 2.0


class Scorer:
    """Scores a batch of samples, one `Outcome` each in input order; a context manager."""

    def score(self, samples: Sequence[Sample]) -> list[Outcome]:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the scorer started (idempotent)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class InProcess(Scorer):
    """Calls a function of ours directly (its exceptions are our bugs and propagate)."""

    def __init__(self, fn: RewardFn) -> None:
        self.call = sample_caller(fn)

    def score(self, samples: Sequence[Sample]) -> list[Outcome]:
        return [Outcome(float(self.call(s))) for s in samples]  # type: ignore[arg-type]  # ours: a float


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    ready: bool = False
    task: int | None = None
    deadline: float = math.inf


class RewardPool(Scorer):
    """`workers` processes calling the user function `ref` ('module:function'), each call under
    `timeout_s`; a failed call scores `failure_reward` and says why in `Outcome.error`."""

    def __init__(self, ref: str, *, workers: int, timeout_s: float, failure_reward: float = 0.0) -> None:
        if workers < 1 or not timeout_s > 0:
            raise ValueError("RewardPool needs workers >= 1 and timeout_s > 0")
        self.ref, self.timeout_s, self.failure_reward = ref, timeout_s, float(failure_reward)
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        try:
            for _ in range(workers):
                self._workers.append(self._start())
        except BaseException:
            self.close()
            raise

    def score(self, samples: Sequence[Sample]) -> list[Outcome]:
        if not self._workers:
            raise RuntimeError("RewardPool is closed")
        outcomes: list[Outcome | None] = [None] * len(samples)
        todo = deque(range(len(samples)))
        while todo or any(w.task is not None for w in self._workers):
            for slot, w in enumerate(self._workers):
                if w.ready and w.task is None and todo:
                    i = todo.popleft()
                    try:
                        w.conn.send((i, samples[i]))
                    except OSError:  # it died while idle: the sample never reached it
                        todo.appendleft(i)
                        self._retire(slot, outcomes)
                        continue
                    w.task, w.deadline = i, time.monotonic() + self.timeout_s
            self._wait(outcomes)
        done = [o for o in outcomes if o is not None]
        assert len(done) == len(samples)
        return done

    def close(self) -> None:
        workers, self._workers = self._workers, []
        for w in workers:
            if w.task is not None:  # closed mid-batch (an exception): its call's result is not wanted
                w.process.kill()
                continue
            with contextlib.suppress(OSError):
                w.conn.send(None)
        end = time.monotonic() + _CLOSE_GRACE_S
        for w in workers:
            w.process.join(max(0.0, end - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()

    @property
    def pids(self) -> list[int | None]:
        return [w.process.pid for w in self._workers]

    def _start(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_serve, args=(child, self.ref, self.failure_reward),
                                    name="rhymerl-reward", daemon=True)
        process.start()
        child.close()
        return _Worker(process, parent)

    def _wait(self, outcomes: list[Outcome | None]) -> None:
        """Take in what the next message, death or timeout brings."""
        deadline = min((w.deadline for w in self._workers), default=math.inf)
        timeout = None if deadline == math.inf else max(0.0, deadline - time.monotonic())
        ready = set(wait([x for w in self._workers for x in (w.conn, w.process.sentinel)], timeout))
        for slot, w in enumerate(self._workers):
            if w.conn in ready or w.process.sentinel in ready:
                self._read(slot, outcomes)
            elif w.task is not None and time.monotonic() >= w.deadline:
                outcomes[w.task] = Outcome(self.failure_reward, f"timed out after {self.timeout_s:g} s")
                w.task = None
                w.process.kill()
                self._retire(slot, outcomes)

    def _read(self, slot: int, outcomes: list[Outcome | None]) -> None:
        w = self._workers[slot]
        try:
            message: Any = w.conn.recv() if w.conn.poll() else None
        except (EOFError, OSError):
            message = None
        if message is None:
            self._retire(slot, outcomes)
        elif message[0] == "ready":
            w.ready = True
        elif message[0] == "load-failed":
            raise RewardError(message[1])
        else:
            index, outcome = message
            assert index == w.task, (index, w.task)
            outcomes[index], w.task, w.deadline = outcome, None, math.inf

    def _retire(self, slot: int, outcomes: list[Outcome | None]) -> None:
        """Reap a worker that is gone or going, fail the call it was running, start its successor."""
        w = self._workers[slot]
        w.process.join(_CLOSE_GRACE_S)
        if w.process.is_alive():
            w.process.kill()
            w.process.join()
        w.conn.close()
        how = _exit_reason(w.process.exitcode)
        if not w.ready:
            raise RewardError(f"spec.reward.function '{self.ref}': a reward worker {how} while importing it")
        if w.task is not None:
            outcomes[w.task] = Outcome(self.failure_reward, f"worker {how} while scoring")
        self._workers[slot] = self._start()


def open_scorer(spec: RewardSpec) -> Scorer:
    """The scorer for a job: the built-in verifier in-process, a user function in a `RewardPool`.
    The user's module is imported here first, so a typo fails before any rollout."""
    if spec.function is None:
        assert spec.verifier is not None
        return InProcess(BUILTIN[spec.verifier])
    load_user_function(spec.function)
    return RewardPool(spec.function, workers=spec.workers, timeout_s=spec.timeout_s,
                      failure_reward=spec.failure_reward)


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _serve(conn: Connection, ref: str, failure_reward: float) -> None:
    """A worker's main: import the function, then score (index, sample) messages until None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent()
    try:
        fn = load_user_function(ref)
    except Exception as exc:
        conn.send(("load-failed", str(exc)))
        return
    conn.send(("ready",))
    call = sample_caller(fn)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        index, sample = message
        try:
            outcome = judge(call(sample), failure_reward)
        except Exception as exc:  # SystemExit is left to end the worker, as the function asked
            outcome = raised(exc, failure_reward)
        conn.send((index, outcome))


def accepted_keywords(fn: Callable[..., object]) -> Callable[[str], bool]:
    """Whether `fn` takes a keyword argument of a given name (a parameter of that name, or **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except ValueError:  # a builtin without a signature: only the three positional arguments
        return lambda name: False
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return lambda name: True
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return lambda name: name in names


def sample_caller(fn: Callable[..., object]) -> Callable[[Sample], object]:
    """Calls `fn(prompt, response, answer)` with the sample's extras that `fn` names as keyword
    parameters; `fn`'s signature is read once, not per sample."""
    takes = accepted_keywords(fn)

    def call(sample: Sample) -> object:
        extras = sample[3] if len(sample) > 3 else {}
        return fn(sample[0], sample[1], sample[2], **{k: v for k, v in extras.items() if takes(k)})

    return call


def _exit_with_parent() -> None:
    """End this worker when the controller process ends, however it ends."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        wait([sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="rhymerl-reward-watch", daemon=True).start()
