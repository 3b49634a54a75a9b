"""The finalizer's Redis cleanup says why it failed without showing a password that an RLJob stored
before the spec refused one in history.redis_url."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from local_servers import free_port

from rhymerl.operator.reconcile.history import FINALIZER
from rhymerl.operator.reconcile.reconciler import _finalize


class _Cluster:
    def __init__(self) -> None:
        self.events: list[str] = []

    async def read_secret(self, namespace: str, name: str, key: str) -> str | None:
        return None

    async def event(self, body: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.events.append(f"{reason}: {message}")

    async def set_finalizers(self, body: dict[str, Any], finalizers: list[str]) -> None:
        raise AssertionError("the finalizer stays while Redis cannot be reached")


def test_a_failed_cleanup_names_the_redis_url_without_its_password() -> None:
    cluster = _Cluster()
    body = {"metadata": {"name": "alpha", "namespace": "team", "finalizers": [FINALIZER]},
            "spec": {"history": {"store": "redis", "redis_url": f"redis://u:s3cret-pw@127.0.0.1:{free_port()}/0"}}}
    with pytest.raises(redis.ConnectionError):  # kopf retries it
        asyncio.run(_finalize(cluster, body))  # type: ignore[arg-type]
    assert len(cluster.events) == 1 and cluster.events[0].startswith("HistoryCleanupFailed: cannot delete")
    assert "redis://u:***@127.0.0.1:" in cluster.events[0] and "s3cret-pw" not in cluster.events[0]
