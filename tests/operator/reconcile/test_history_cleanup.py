"""The finalizer's Redis cleanup, one pass at a time against a recorded cluster and a forced clock: it stops
the job's roles before deleting keys, says why it fails without showing a password that an RLJob stored
before the spec refused one in history.redis_url, and gives up after a bounded time instead of holding
the deletion forever."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from local_servers import free_port

from rhymerl.api.history_keys import REDIS_ENDPOINTS_ENV, REDIS_PASSWORD_ENV, serves
from rhymerl.operator.reconcile import reconciler
from rhymerl.operator.reconcile.history import CLEANUP_DEADLINE_S, FINALIZER, STOP_WAIT_S
from rhymerl.operator.reconcile.reconciler import _finalize

DELETED_AT = "2026-11-26T10:00:00Z"


class _Cluster:
    """What _finalize reads and writes, recorded; `pods` and `secret` are what the cluster holds."""

    def __init__(self, pods: int = 0, secret: str | None = None) -> None:
        self.pods = pods
        self.secret = secret
        self.events: list[str] = []
        self.scaled: list[str] = []
        self.status: list[dict[str, Any]] = []
        self.finalizers: list[list[str]] = []

    async def list_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return [{"metadata": {"name": f"{job}-rollout-{i}"}} for i in range(self.pods)]

    async def list_kind(self, kind: str, namespace: str, job: str) -> list[dict[str, Any]]:
        owner = [{"uid": "u1"}]
        return [{"metadata": {"name": f"{job}-{role}", "ownerReferences": owner}, "spec": {"replicas": n}}
                for role, n in (("controller", 1), ("rollout", 2), ("reward", 0))]

    async def scale_to_zero(self, namespace: str, name: str) -> None:
        self.scaled.append(name)

    async def read_secret(self, namespace: str, name: str, key: str) -> str | None:
        return self.secret

    async def event(self, body: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.events.append(f"{reason}: {message}")

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.status.append(status)

    async def set_finalizers(self, body: dict[str, Any], finalizers: list[str]) -> None:
        self.finalizers.append(finalizers)


def _body(url: str, secret: dict[str, str] | None = None, snake_case: bool = False) -> dict[str, Any]:
    """A job being deleted, as the API server stores it (camelCase; snake_case: stored before that CRD)."""
    history: dict[str, Any] = {"store": "redis", "redis_url" if snake_case else "redisUrl": url}
    if secret is not None:
        history["redis_password_secret" if snake_case else "redisPasswordSecret"] = secret
    return {"metadata": {"name": "alpha", "namespace": "team", "uid": "u1", "finalizers": [FINALIZER],
                         "deletionTimestamp": DELETED_AT}, "spec": {"history": history}}


def _at(seconds: int) -> str:
    return f"2026-11-26T10:{seconds // 60:02d}:{seconds % 60:02d}Z"


def _unreachable() -> str:
    return f"redis://u:s3cret-pw@127.0.0.1:{free_port()}/0"  # nothing listens there


def test_a_failed_cleanup_names_the_redis_url_without_its_password_and_says_until_when_it_retries() -> None:
    cluster = _Cluster()
    with pytest.raises(redis.ConnectionError):  # the operator retries it with backoff
        asyncio.run(_finalize(cluster, _body(_unreachable()), _at(30)))  # type: ignore[arg-type]
    assert len(cluster.events) == 1 and cluster.events[0].startswith("HistoryCleanupFailed: cannot delete")
    assert "redis://u:***@127.0.0.1:" in cluster.events[0] and "s3cret-pw" not in cluster.events[0]
    assert f"retrying until {_at(CLEANUP_DEADLINE_S)}" in cluster.events[0]
    degraded = [c for c in cluster.status[0]["conditions"] if c["type"] == "Degraded"]
    assert degraded[0]["reason"] == "HistoryCleanupFailed" and degraded[0]["status"] == "True"
    assert cluster.finalizers == []


@pytest.mark.parametrize("where", ["?password={}", "/{}", "/0#{}", "/0?db=1&token={}"])
def test_a_failed_cleanup_shows_no_credential_a_stored_url_carries_in_its_query_path_or_fragment(where: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}" + where.format("s3cret-pw")
    cluster = _Cluster()
    with pytest.raises((redis.ConnectionError, ValueError, TypeError)):  # the operator retries it with backoff
        asyncio.run(_finalize(cluster, _body(url), _at(30)))  # type: ignore[arg-type]
    [event] = cluster.events
    assert event.startswith("HistoryCleanupFailed: cannot delete") and "s3cret-pw" not in event
    assert "s3cret-pw" not in str(cluster.status)


def test_a_cleanup_still_failing_at_its_deadline_releases_the_finalizer_with_a_warning() -> None:
    cluster = _Cluster()
    body = _body(_unreachable(), snake_case=True)
    wait = asyncio.run(_finalize(cluster, body, _at(CLEANUP_DEADLINE_S)))  # type: ignore[arg-type]
    assert wait is None and cluster.finalizers == [[]]
    assert len(cluster.events) == 1 and cluster.events[0].startswith("HistoryCleanupAbandoned: cannot delete")
    assert "the keys stay (redis-cli --scan --pattern 'rhymerl:team:alpha:*'" in cluster.events[0]


def test_the_roles_are_stopped_first_and_the_keys_wait_for_their_pods_until_the_stop_wait_ends(
        redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.set("rhymerl:team:alpha:meta", b"x")
    cluster = _Cluster(pods=2)
    wait = asyncio.run(_finalize(cluster, _body(redis_url), _at(10)))  # type: ignore[arg-type]
    assert cluster.scaled == ["alpha-controller", "alpha-rollout"]  # the one at zero is left alone
    assert wait is not None and 0 < wait <= STOP_WAIT_S - 10
    assert r.exists("rhymerl:team:alpha:meta") == 1 and cluster.finalizers == []
    wait = asyncio.run(_finalize(cluster, _body(redis_url), _at(STOP_WAIT_S)))  # type: ignore[arg-type]
    assert wait is None and r.exists("rhymerl:team:alpha:meta") == 0 and cluster.finalizers == [[]]
    assert cluster.events == ["HistoryDeleted: deleted 1 history keys from Redis (2 pods had not stopped by then)"]
    r.close()


def test_a_password_neither_in_a_readable_secret_nor_in_the_operators_environment_is_named_as_the_cause(
        monkeypatch: pytest.MonkeyPatch, redis_with_password: tuple[str, str]) -> None:
    url, password = redis_with_password
    monkeypatch.delenv(REDIS_PASSWORD_ENV, raising=False)
    body = _body(url, {"name": "redis-auth", "key": "pw"})
    cluster = _Cluster(secret=None)  # the Secret is missing, or the operator may not read it
    with pytest.raises(PermissionError):
        asyncio.run(_finalize(cluster, body, _at(0)))  # type: ignore[arg-type]
    assert cluster.events[0].startswith("HistoryCleanupFailed: cannot delete the job's history keys")
    assert "the Secret team/redis-auth (key pw) is missing or the operator may not read it" in cluster.events[0]
    monkeypatch.setenv(REDIS_PASSWORD_ENV, password)  # the chart's way: the operator's own environment
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    monkeypatch.setenv(REDIS_ENDPOINTS_ENV, f"{host}:{port}")  # ... with the Redis it is for
    cluster = _Cluster(secret=None)
    asyncio.run(_finalize(cluster, body, _at(0)))  # type: ignore[arg-type]
    assert cluster.events == ["HistoryDeleted: deleted 0 history keys from Redis"] and cluster.finalizers == [[]]


def test_the_operators_own_redis_password_goes_only_to_the_redis_it_is_for(
        monkeypatch: pytest.MonkeyPatch, redis_with_password: tuple[str, str]) -> None:
    """A job names a Redis the operator's password is not for (a host it controls, here the test's Redis
    under another name): the cleanup fails saying so, and the password never left the operator."""
    url, password = redis_with_password
    monkeypatch.setenv(REDIS_PASSWORD_ENV, password)
    monkeypatch.setenv(REDIS_ENDPOINTS_ENV, "rl-operator-redis.rhymerl.svc.cluster.local:6379")
    sent: list[str | None] = []

    async def recording(url: str, namespace: str, job: str, password: str | None = None) -> int:
        sent.append(password)
        return 0

    monkeypatch.setattr(reconciler, "delete_history", recording)
    cluster = _Cluster(secret=None)
    with pytest.raises(PermissionError):
        asyncio.run(_finalize(cluster, _body(url, {"name": "redis-auth", "key": "pw"}), _at(0)))  # type: ignore[arg-type]
    assert sent == [] and password not in cluster.events[0]
    assert f"{REDIS_PASSWORD_ENV} is for rl-operator-redis.rhymerl.svc.cluster.local:6379, not " in cluster.events[0]


@pytest.mark.parametrize(("endpoints", "url", "namespace", "serves_it"), [
    ("rl-redis.rhymerl.svc.cluster.local:6379", "redis://rl-redis.rhymerl:6379/0", "team", True),
    ("rl-redis.rhymerl.svc.cluster.local:6379", "redis://rl-redis:6379/0", "rhymerl", True),  # the short name, there
    ("rl-redis.rhymerl.svc.cluster.local:6379", "redis://rl-redis:6379/0", "team", False),  # team's own rl-redis
    ("rl-redis.rhymerl.svc.cluster.local:6379", "redis://rl-redis.rhymerl.svc:6380/0", "team", False),  # a port
    ("rl-redis.rhymerl.svc.cluster.local:6379", "redis://RL-Redis.rhymerl.svc.cluster.local/1", "x", True),
    ("rl-redis.rhymerl.svc.cluster.local:6379", "redis://attacker.example.com:6379/0", "team", False),
    ("10.0.0.7:6379, redis.data.svc.cluster.local:6379", "redis://10.0.0.7/0", "team", True),
    ("", "redis://rl-redis.rhymerl:6379/0", "team", False),
    ("rl-redis.rhymerl.svc.cluster.local:6379", "unix:///run/redis.sock", "team", False),
])
def test_a_jobs_redis_url_is_the_operators_redis_only_as_cluster_dns_resolves_it_from_the_jobs_namespace(
        endpoints: str, url: str, namespace: str, serves_it: bool) -> None:
    assert serves(endpoints, url, namespace) is serves_it
