"""Published policy versions to rollout workers over a broadcast from the train worker.

`rollout.weight_sync: collective` (the default where workers are processes of their own): at each
publish the fleet's live workers receive the new version together, in one group with the train
worker (rank 0), beside the calls they run (workers/roles/weight_sync.py); a worker that needs a
version it was not sent, or no longer holds (it joined, or a call of its starts on an older
version than it loaded last), gets it through a group of its own before it loads. The object store keeps every version as before, and a worker
loads its copy where a broadcast failed (after RolloutWorker.STAGED_WAIT_S): a lost transfer
costs time, never a wrong or a missing version. Versions older than the train worker keeps
(TrainWorker.KEEP_VERSIONS), and versions it never published (a resumed run's in-flight versions,
restored from its checkpoint), go through the object store at once: a broadcast of a version the
sender does not hold would keep its receivers waiting out STAGED_WAIT_S for nothing.

Every call here is made from the step loop's one thread, so each receiver takes its transfers in
the order they were made, one at a time; the train worker sends them side by side
(TrainWorker.CONCURRENCY_GROUPS), so no transfer waits on another, and one held by a receiver that
died holds no other (a replacement worker loads the current version at once).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence

from rhymerl.workers.controller.role_apis import RolloutAPI, TrainAPI
from rhymerl.workers.controller.transport import Handle, Result, Transport
from rhymerl.workers.roles.train_worker import TrainWorker
from rhymerl.workers.roles.weight_layout import Group, Layout


class WeightBroadcast:
    def __init__(self, t: Transport, trainer: Handle[TrainAPI], channel: tuple[str, int, Layout]) -> None:
        """trainer: the train worker of rank 0; channel: its `weight_channel()`."""
        self.t, self.trainer = t, trainer
        self.host, self.port, self.layout = channel
        self.ids = itertools.count(1)
        self.latest = -1
        self.published: set[int] = set()  # versions the train worker handed out to send (those it keeps)
        self.sent: dict[int, set[int]] = defaultdict(set)  # worker id -> versions sent its way
        self.sends: list[Result[float]] = []  # the train worker's results of transfers not read yet
        self.failed = 0  # transfers whose sender failed (their receivers loaded the object store's copy)

    def publish(self, version: int, workers: Sequence[tuple[int, Handle[RolloutAPI]]]) -> None:
        """A new version to every live worker (id, handle) at once, in one group."""
        self.latest = max(self.latest, version)
        self.published = {v for v in self.published | {version} if v > self.latest - TrainWorker.KEEP_VERSIONS}
        if workers:
            group = Group(self.host, self.port, f"fleet-{next(self.ids)}", len(workers) + 1)
            self._send(version, group, [(rank + 1, w, h) for rank, (w, h) in enumerate(workers)])

    def carries(self, version: int) -> bool:
        """Whether `version` goes by broadcast: published through here, and still kept by the train worker."""
        return version in self.published

    def ensure(self, version: int, worker: int, handle: Handle[RolloutAPI]) -> None:
        """Before a worker loads `version`: sent to it alone, unless already on its way. The load
        takes it and drops whatever it staged up to it, so those count as not sent from then on."""
        if version not in self.sent[worker]:
            self._send(version, Group(self.host, self.port, f"one-{next(self.ids)}", 2), [(1, worker, handle)])
        self.sent[worker] = {v for v in self.sent[worker] if v > version}

    def forget(self, worker: int) -> None:
        self.sent.pop(worker, None)

    def _send(self, version: int, group: Group, receivers: list[tuple[int, int, Handle[RolloutAPI]]]) -> None:
        self.sends.append(self.t.call(self.trainer, TrainAPI.send_weights, version, group))
        for rank, worker, handle in receivers:
            self.t.tell(handle, RolloutAPI.receive_weights, version, group, rank, self.layout)
            self.sent[worker] = {v for v in self.sent[worker] if self.carries(v)} | {version}

    def settle(self) -> None:
        """Read the finished transfers: each failed one is counted in `failed`."""
        for ref in [r for r in self.sends if self.t.done(r)]:
            self.sends.remove(ref)
            try:
                self.t.get(ref)
            except Exception:  # the train worker gone, or its broadcast broke (a receiver died)
                self.failed += 1
