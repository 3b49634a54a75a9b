"""The policy weights a rollout fleet's workers load: which versions are kept (those a call or a
parked sample still runs with), how each worker is given one (by broadcast where it carries the
worker forward, else through the object store), and how long the loads took."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence

from rhymerl.workers.controller.fleet_records import Member
from rhymerl.workers.controller.role_apis import RolloutAPI, Weights, WeightsRef
from rhymerl.workers.controller.transport import Result, ResultLost, Transport, WorkerGone
from rhymerl.workers.controller.weight_broadcast import WeightBroadcast
from rhymerl.workers.roles.weight_sync import STAGED_WAIT_S


class FleetWeights:
    """The versions in use and the workers' loads of them."""

    def __init__(self, transport: Transport, note: Callable[[str], None]) -> None:
        self.transport, self.note = transport, note
        self.version = 0
        self.weights: dict[int, Weights | Result[Weights]] = {}  # policy version -> its weights (those in use)
        self.broadcast: WeightBroadcast | None = None

    def start(self, version: int, weights: dict[int, Weights | Result[Weights]],
              broadcast: WeightBroadcast | None) -> None:
        self.version, self.weights, self.broadcast = version, weights, broadcast
        if self.broadcast is not None:
            self.broadcast.publish(version, [])

    def publish(self, version: int, weights: Weights | Result[Weights], in_use: Collection[int],
                live: Sequence[Member], idle: Sequence[Member]) -> None:
        """A new version; `in_use`: the versions calls and parked samples hold (kept); `idle` members
        (those running no call) load it now."""
        self.weights[version] = weights
        keep = {version, *in_use}
        for old in [v for v in self.weights if v not in keep]:
            del self.weights[old]
        self.version = version
        if self.broadcast is not None:
            self.broadcast.publish(version, [(m.id, m.handle) for m in live])
        for m in idle:
            self.load(m, version)

    def load(self, m: Member, version: int) -> None:
        if m.version != version:
            weights = self.weights[version]
            # a broadcast carries a worker forward only: an older version (a deferred sample's, a
            # resumed run's in-flight round) comes from the object store
            newer = m.version is None or version > m.version
            if self.broadcast is not None and newer and self.broadcast.carries(version):
                self.broadcast.ensure(version, m.id, m.handle)
                passed: Weights | WeightsRef = self.transport.deferred(weights)
            else:
                passed = self.transport.arg(weights)
            m.loads.append(self.transport.call(m.handle, RolloutAPI.load_weights, version, passed))
            m.version = version

    def forget(self, member_id: int) -> None:
        if self.broadcast is not None:
            self.broadcast.forget(member_id)

    def sync(self, live: Sequence[Member]) -> tuple[float, int]:
        """The longest weight load of any worker since the last call (they load in parallel), and
        how many loads found no broadcast copy and took the object store's (said in the run's log)."""
        if self.broadcast is not None:
            broke = self.broadcast.failed
            self.broadcast.settle()
            if self.broadcast.failed > broke:
                self.note(f"{self.broadcast.failed - broke} weight broadcast(s) broke (a receiver gone); the other "
                          "receivers' copies arrived or their loads take the object store's")
        seconds, fell_back = 0.0, 0
        for m in live:
            for r in m.loads:
                if self.transport.done(r):
                    with contextlib.suppress(WorkerGone, ResultLost):
                        took, missed = self.transport.get(r)
                        seconds, fell_back = max(seconds, float(took)), fell_back + bool(missed)
            m.loads = [r for r in m.loads if not self.transport.done(r)]
        if fell_back:
            self.note(f"{fell_back} weight load(s) found no broadcast copy within "
                      f"{STAGED_WAIT_S:.0f}s and took the object store's")
        return seconds, fell_back
