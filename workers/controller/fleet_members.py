"""Who is in a rollout fleet: workers join and leave to match how many are wanted within the room
the cluster has, leavers chosen by pod ordinal (the pods a StatefulSet removes) and then by the
least work held; the fleet says how many leading pod ordinals hold its workers, and waits, saying
so, while no worker is live."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable

from rhymerl.api import RLJob
from rhymerl.workers.controller.fleet_records import (
    CAPACITY_EVERY_S,
    WAIT_NOTE_S,
    Book,
    Calls,
    Member,
    pod_ordinal,
)
from rhymerl.workers.controller.fleet_weights import FleetWeights
from rhymerl.workers.controller.role_apis import RolloutAPI
from rhymerl.workers.controller.transport import Handle, Transport, WorkerGone


class Membership:
    """The fleet's workers and their comings and goings."""

    def __init__(self, job: RLJob, transport: Transport, book: Book, calls: Calls, weights: FleetWeights,
                 start_worker: Callable[[], Handle[RolloutAPI]], wanted: Callable[[], int],
                 note: Callable[[str], None], say: Callable[[str], None],
                 in_use: Callable[[int | None], None]) -> None:
        """on_join (set by the fleet): what a worker that joined does (take work, if a round runs)."""
        self.job, self.transport, self.book, self.calls, self.weights = job, transport, book, calls, weights
        self.start_worker, self.wanted, self.note, self.say, self.in_use = start_worker, wanted, note, say, in_use
        self.on_join: Callable[[Member], None] = lambda m: None
        self.members: list[Member] = []
        self.ids = itertools.count()
        self.started = False  # the fleet was up once: changes of its size are news from then on
        self.last_count: tuple[int, int] | None = None
        self.waiting_since: float | None = None
        self._waiting_said = -math.inf
        self._in_use_said: int | None = None
        self._capacity_at = -math.inf
        self._capacity: int | None = None

    def reconcile(self, wait: bool = False) -> None:
        """Workers join and leave to match `wanted()` within the room there is; `wait`: until at least
        one worker is live."""
        while True:
            self._admit_joiners()
            want = max(1, self.wanted())
            joining = [m for m in self.members if not m.joined]
            staying = [m for m in self.live() if not m.leaving]
            excess = len(staying) + len(joining) - want
            if excess > 0:  # workers still starting go first, then those holding the least work
                for m in sorted(joining, key=lambda m: -m.id)[:excess]:
                    self.stop(m)
                for m in self._leaving_order(staying)[: max(0, excess - len(joining))]:
                    self._retire(m)
            elif excess < 0:
                capacity = self._capacity_now()  # pods that joined; every member holds one of them
                room = -excess if capacity is None else min(-excess, capacity - len(self.members))
                for _ in range(max(0, room)):
                    self.members.append(Member(next(self.ids), self.start_worker()))
                self._admit_joiners()  # those that start at once (in this process) join now
            if self.started:
                self._say_count(self.live_count(), want)
            self._report_in_use()
            if not wait or self.live():
                return
            self.wait_for_worker()

    def _admit_joiners(self) -> None:
        if not self.weights.weights:  # workers started before `start` join once there are weights to give them
            return
        for m in [m for m in self.members if not m.joined]:
            try:
                ready = self.transport.ready(m.handle)
                host = self.transport.get(self.transport.call(m.handle, RolloutAPI.host)) if ready else None
            except WorkerGone:
                self.remove(m)
                self.note("a rollout worker died while it started")
                continue
            if ready:
                m.joined = True
                m.pod = pod_ordinal(str(host), self.job.metadata.name)
                self.weights.load(m, self.weights.version)
                self.on_join(m)

    def least_busy(self, members: list[Member]) -> list[Member]:
        """Members by the work they hold now (their running calls' samples as last reported), least
        first (the newest first among equals)."""
        def work(m: Member) -> tuple[int, int]:
            return sum(len(self.book.tokens(c.id)) for c in self.calls.active(m)), -m.id
        return sorted(members, key=work)

    def _leaving_order(self, members: list[Member]) -> list[Member]:
        """Which members leave first when fewer are wanted: those on the highest pod ordinals (the pods a
        StatefulSet removes), then those holding the least work."""
        rank = {m.id: i for i, m in enumerate(self.least_busy(members))}
        return sorted(members, key=lambda m: (1 if m.pod is None else -m.pod, rank[m.id]))

    def pods_in_use(self) -> int | None:
        """How many leading rollout pod ordinals hold every worker of the fleet (leaving ones included
        until they are stopped): a StatefulSet at that count or more removes none of them. None: a
        worker's pod is not known (starting, or not in a cluster)."""
        if any(m.pod is None for m in self.members):
            return None
        return max((m.pod + 1 for m in self.members if m.pod is not None), default=0)

    def _report_in_use(self) -> None:
        found = self.pods_in_use()
        if found != self._in_use_said:
            self._in_use_said = found
            self.in_use(found)

    def _retire(self, m: Member) -> None:
        """Ask a worker to leave: one running a call hands its samples back first."""
        m.leaving = True
        if self.calls.active(m):
            self.transport.tell(m.handle, RolloutAPI.leave)
        elif not self.calls.of(m):  # outputs of its calls are scored first (collect stops it then)
            self.stop(m)

    def remove(self, m: Member) -> None:
        if m in self.members:
            self.members.remove(m)
            self._report_in_use()
        self.weights.forget(m.id)

    def stop(self, m: Member) -> None:
        self.remove(m)
        self.transport.stop(m.handle)

    def _capacity_now(self) -> int | None:
        now = time.monotonic()
        if now - self._capacity_at >= CAPACITY_EVERY_S:
            self._capacity, self._capacity_at = self.transport.capacity("rollout"), now
        return self._capacity

    def _say_count(self, live: int, want: int) -> None:
        if (live, want) != self.last_count:
            self.note(f"rollout workers: {live} of {want} wanted")
            self.say(f"running with {live} of {want} rollout workers")
            self.last_count = (live, want)

    def wait_for_worker(self) -> None:
        """No worker takes work: wait for one to start or join, saying so (in events.log once a minute
        after the first minute, or at once once the fleet had been up)."""
        now = time.monotonic()
        if self.waiting_since is None:
            self.waiting_since, self._waiting_said = now, -math.inf
        if now - self._waiting_said >= WAIT_NOTE_S:
            msg = f"waiting for a rollout worker: none is live ({len(self.members)} starting, {self.wanted()} wanted)"
            self.say(msg)
            if self.started or now - self.waiting_since >= WAIT_NOTE_S:
                self.note(msg)
                self._waiting_said = now
        time.sleep(0.2)

    def live_count(self) -> int:
        """Workers in the fleet that take work (not leaving)."""
        return len(self.staying())

    def live(self) -> list[Member]:
        return [m for m in self.members if m.joined]

    def staying(self) -> list[Member]:
        return [m for m in self.live() if not m.leaving]

    def at(self, slot: int) -> Member:
        return next(m for m in self.live() if m.slot == slot)
