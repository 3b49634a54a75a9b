"""Weights from the trainer to rollout workers over a torch.distributed broadcast.

Ray's object store moves a policy version by serialising it (PolicyTrace measured 0.015 GB/s
across nodes); a collective moves the raw bytes once per receiver link. The train worker (rank 0
of the train role) opens a TCPStore on a free port once (`WeightSender`); for each transfer the
step loop names a group (an id, the receivers, their ranks 1..n) and every member joins it, the
sender broadcasting, the receivers receiving. Groups are stateless process groups
(`ProcessGroupGloo` over a prefix of the one store), one per transfer, so the rollout fleet can
change between transfers and a failed transfer leaves nothing behind; a worker that joins mid-run
gets the current version through a group of its own.

Tensors travel in buckets of at most BUCKET_BYTES, one dtype each, flattened: few messages, and a
receiver holds at most one bucket beyond the weights it builds. Gloo over TCP, CPU tensors on both
ends (what the rollout workers load from); NCCL into GPU-resident weights is not built yet.

A receiver stages what it received (`WeightReceiver.staged`); the worker loads it at its next
call boundary, so a transfer overlaps the call it runs.
"""

from __future__ import annotations

import datetime
import os
import threading
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

from rhymerl.workers import faults
from rhymerl.workers.roles.weight_layout import Group, Layout
from rhymerl.workers.train.ranks import host_address

BUCKET_BYTES = 64 << 20
TIMEOUT_ENV = "RHYMERL_WEIGHT_SYNC_TIMEOUT_S"
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "120")))
"""How long a member waits for the others to join a group or finish a broadcast (a member that
died before it joined holds the others this long)."""
STAGED_WAIT_S = TIMEOUT.total_seconds() / 2
"""How long a load waits for a broadcast version before it takes the object store's copy."""


def buckets(layout: Layout) -> list[list[int]]:
    """Indexes of the tensors each bucket carries (one dtype, at most BUCKET_BYTES unless one tensor is larger)."""
    out: list[list[int]] = []
    size, dtype = 0, ""
    for i, (_, shape, dt) in enumerate(layout.tensors):
        n = _numel(shape) * getattr(torch, dt).itemsize
        if not out or dt != dtype or size + n > BUCKET_BYTES:
            out.append([])
            size, dtype = 0, dt
        out[-1].append(i)
        size += n
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class _Groups:
    """Process groups over the sender's store, one per transfer: a fresh group costs a rendezvous
    (milliseconds over gloo) and nothing of a failed transfer (a member gone, a half-made group)
    can reach the next one. The connection to each store is kept."""

    def __init__(self) -> None:
        self._stores: dict[tuple[str, int], Any] = {}
        self._lock = threading.Lock()

    def open(self, group: Group, rank: int, store: Any = None) -> Any:
        with self._lock:
            key = (group.host, group.port)
            if store is None:
                store = self._stores.get(key) or TCPStore(group.host, group.port, is_master=False, timeout=TIMEOUT)
                self._stores[key] = store
        return dist.ProcessGroupGloo(PrefixStore(f"weights/{group.group_id}", store), rank, group.size, TIMEOUT)


def _broadcast(pg: Any, t: Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pg.broadcast([t], opts).wait()


class WeightSender:
    """The train worker's side: a store for every transfer's rendezvous, and the broadcasts."""

    def __init__(self) -> None:
        self.host = host_address()
        self.store = TCPStore(self.host, 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
        self._groups = _Groups()

    @property
    def port(self) -> int:
        return int(self.store.port)

    def send(self, group: Group, weights: Mapping[str, Tensor]) -> None:
        """Broadcast `weights` to `group`'s receivers. Each transfer meets them over a connection of its
        own to the store: a store client serves one request at a time, so a rendezvous waiting for a
        receiver that died would hold every other transfer's (those run on other threads) until
        TIMEOUT."""
        pg = self._groups.open(group, 0, TCPStore(self.host, self.port, is_master=False, timeout=TIMEOUT))
        layout = Layout.of(weights)
        tensors = [weights[name] for name, _, _ in layout.tensors]
        for bucket in buckets(layout):
            flat = torch.cat([tensors[i].detach().reshape(-1).cpu() for i in bucket])
            _broadcast(pg, flat)


class WeightReceiver:
    """A rollout worker's side: receive a version into a staging copy; `take` it at a call boundary."""

    def __init__(self) -> None:
        self._groups = _Groups()
        self._staged: dict[int, dict[str, Tensor] | None] = {}  # None: the transfer failed
        self._arrived: dict[int, threading.Event] = {}
        self._holds = -1  # the version the worker loaded last (the fleet's `Member.version`)
        self._lock = threading.Lock()

    def _event_locked(self, version: int) -> threading.Event:
        return self._arrived.setdefault(version, threading.Event())

    def _event(self, version: int) -> threading.Event:
        with self._lock:
            return self._event_locked(version)

    def receive(self, version: int, group: Group, rank: int, layout: Layout) -> None:
        """Receive `version` into a staging copy; a failed transfer wakes a load waiting for it at once."""
        faults.point("weight-receive", version)
        out: dict[str, Tensor] | None = None
        try:
            out = self._receive(group, rank, layout)
        finally:
            with self._lock:
                if version > self._holds:  # else the fleet sends it again if the worker needs it again
                    if out is not None or version not in self._staged:
                        self._staged[version] = out
                    self._event_locked(version).set()

    def _receive(self, group: Group, rank: int, layout: Layout) -> dict[str, Tensor]:
        pg = self._groups.open(group, rank)
        out: dict[str, Tensor] = {}
        for bucket in buckets(layout):
            specs = [layout.tensors[i] for i in bucket]
            dtype = getattr(torch, specs[0][2])
            flat = torch.empty(sum(_numel(shape) for _, shape, _ in specs), dtype=dtype)
            _broadcast(pg, flat)
            offset = 0
            for name, shape, _ in specs:
                n = _numel(shape)
                out[name] = flat[offset: offset + n].view(shape)
                offset += n
        for alias, name in layout.aliases:
            out[alias] = out[name]
        return out

    def take(self, version: int, timeout: float) -> dict[str, Tensor] | None:
        """The staged weights of `version` once they arrived (None if their transfer failed, or
        nothing came within `timeout`); the worker holds `version` from now on (`loaded`)."""
        arrived = self._event(version).wait(timeout)
        with self._lock:
            weights = self._staged.get(version) if arrived else None
            self._loaded_locked(version)
            return weights

    def loaded(self, version: int) -> None:
        """The worker loaded `version` from elsewhere (the object store). It may be older than the
        one it held (a resumed or deferred round's): a transfer of a newer version is then wanted
        again, as the fleet sends one whenever the worker moves forward (WeightBroadcast.ensure)."""
        with self._lock:
            self._loaded_locked(version)

    def _loaded_locked(self, version: int) -> None:
        """Staged versions up to `version` are dropped (one that comes after is a new transfer)."""
        self._holds = version
        for v in [v for v in self._staged if v <= version]:
            del self._staged[v]
        for v in [v for v in self._arrived if v <= version]:
            del self._arrived[v]
