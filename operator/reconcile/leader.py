"""Leader election on a coordination.k8s.io Lease, with client-go's leaderelection semantics.

Two operator replicas: both watch and keep their caches warm, only the Lease's holder reconciles. The
holder renews every `retry_s`; another replica takes over once it has seen the same Lease record unchanged
for `duration_s` by its own clock (client-go's observedTime: no trust in the other node's clock). A
holder that could not renew for `renew_deadline_s` stops reconciling, well before anyone may take over
(renew_deadline_s < duration_s). A replica that stops releases the Lease, so the other takes over at once.
Why a Lease and not kopf's peering: peering pauses operators of a lower priority and, between peers of
equal priority, only warns; a Lease is what Kubernetes' own controllers and every operator SDK use, and
needs one namespaced object and one RBAC rule (get, create, update leases).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)
LEASE_NAME = "rhymerl-operator"
Action = Literal["acquire", "renew", "wait"]


@dataclass(frozen=True)
class Record:
    """What a Lease's spec says (the fields leader election uses)."""

    holder: str = ""
    duration_s: int = 0
    acquire_time: str = ""
    renew_time: str = ""
    transitions: int = 0

    @staticmethod
    def of(lease: Mapping[str, Any] | None) -> Record | None:
        if lease is None:
            return None
        spec = lease.get("spec") or {}
        return Record(str(spec.get("holderIdentity") or ""), int(spec.get("leaseDurationSeconds") or 0),
                      str(spec.get("acquireTime") or ""), str(spec.get("renewTime") or ""),
                      int(spec.get("leaseTransitions") or 0))


def decide(record: Record | None, me: str, now: float, observed_at: float, duration_s: float) -> Action:
    """Pure: take the Lease (free, or its holder silent for `duration_s` since `observed_at`), renew it
    (ours), or wait."""
    if record is None or not record.holder:
        return "acquire"
    if record.holder == me:
        return "renew"
    if now >= observed_at + max(duration_s, record.duration_s):
        return "acquire"
    return "wait"


class LeaseApi(Protocol):
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def write_lease(self, namespace: str, body: Mapping[str, Any], create: bool) -> dict[str, Any]: ...


def micro_time(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Holds (or waits for) Lease `namespace/name` as `identity`; `on_change(leading)` hears of every change.
    `clock`: seconds (wall time, written into the Lease; tests inject their own)."""

    def __init__(self, api: LeaseApi, namespace: str, identity: str, *, name: str = LEASE_NAME,
                 duration_s: float = 15.0, renew_deadline_s: float = 10.0, retry_s: float = 2.0,
                 clock: Callable[[], float] | None = None,
                 on_change: Callable[[bool], None] | None = None) -> None:
        if not retry_s < renew_deadline_s < duration_s:
            raise ValueError(f"leader election needs retry {retry_s} s < renew deadline {renew_deadline_s} s "
                             f"< lease duration {duration_s} s")
        self.api, self.namespace, self.identity, self.name = api, namespace, identity, name
        self.duration_s, self.renew_deadline_s, self.retry_s = duration_s, renew_deadline_s, retry_s
        self.clock = clock or time.time
        self.on_change = on_change
        self.leading = False
        self._observed: Record | None = None
        self._observed_at = 0.0
        self._renewed_at = 0.0

    def _set(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            log.info("%s: %s the lease %s/%s", self.identity, "holds" if leading else "lost", self.namespace, self.name)
            if self.on_change is not None:
                self.on_change(leading)

    async def try_once(self) -> bool:
        """One round: read the Lease, take or renew it if we may. Returns whether we lead now."""
        now = self.clock()
        try:
            lease = await self.api.get_lease(self.namespace, self.name)
            record = Record.of(lease)
            if record != self._observed:
                self._observed, self._observed_at = record, now
            action = decide(record, self.identity, now, self._observed_at, self.duration_s)
            if action == "wait":
                self._set(False)
                return False
            stamp = micro_time(now)
            previous = record or Record()
            spec = {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.duration_s),
                    "acquireTime": previous.acquire_time if action == "renew" else stamp, "renewTime": stamp,
                    "leaseTransitions": previous.transitions + (1 if action == "acquire" and previous.holder else 0)}
            meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
            if lease is not None:
                meta["resourceVersion"] = lease.get("metadata", {}).get("resourceVersion")
            written = await self.api.write_lease(
                self.namespace, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                                 "spec": spec}, create=lease is None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a conflict (someone else wrote first), a timeout: not renewed this round
            log.debug("%s: lease %s/%s not renewed: %s", self.identity, self.namespace, self.name, exc)
            if self.leading and now - self._renewed_at >= self.renew_deadline_s:
                self._set(False)
            return self.leading
        self._observed, self._observed_at = Record.of(written), now
        self._renewed_at = now
        self._set(True)
        return True

    async def release(self) -> None:
        """Give the Lease up (a graceful stop): the other replica takes over without waiting it out."""
        if not self.leading:
            return
        self._set(False)
        try:
            lease = await self.api.get_lease(self.namespace, self.name)
            if lease is not None and Record.of(lease) == self._observed:
                spec = {**(lease.get("spec") or {}), "holderIdentity": "", "leaseDurationSeconds": 1}
                await self.api.write_lease(self.namespace, {**lease, "spec": spec}, create=False)
        except Exception as exc:
            log.warning("%s: cannot release the lease: %s", self.identity, exc)

    async def run(self) -> None:
        while True:
            await self.try_once()
            await asyncio.sleep(self.retry_s)
