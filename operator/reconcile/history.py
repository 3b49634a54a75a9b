"""A job's rollout history in Redis outlives its pods: the operator deletes it when the RLJob goes.

Key scheme (the Redis history store of the distributed runtime must use it): every key of job
`<job>` in namespace `<namespace>` starts with `rhymerl:<namespace>:<job>:`. Jobs share a Redis,
so the cleanup deletes by that prefix only, never more. Garbage collection cannot do this (Redis is
not a Kubernetes object), which is why an RLJob with `history.store: redis` carries FINALIZER.

The Redis password: the job's `history.redis_password_secret`, read through the API when the operator
may get Secrets in the job's namespace; otherwise PASSWORD_ENV in the operator's own environment (the
Helm chart fills it from its Redis Secret, so the operator needs no permission on Secrets).
"""

from __future__ import annotations

import redis.asyncio as aioredis

FINALIZER = "rhymerl.io/history-cleanup"
PASSWORD_ENV = "RHYMERL_REDIS_PASSWORD"
SCAN_BATCH = 500


def key_prefix(namespace: str, job: str) -> str:
    """`rhymerl:<namespace>:<job>:`; names cannot hold ':' so one job's prefix never covers another's."""
    return f"rhymerl:{namespace}:{job}:"


def _pattern(prefix: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix) + "*"


async def delete_history(url: str, namespace: str, job: str, password: str | None = None,
                         timeout_s: float = 10.0) -> int:
    """Delete every key of the job's history from the Redis at `url`; returns how many were deleted."""
    client = aioredis.Redis.from_url(url, password=password, socket_timeout=timeout_s,
                                     socket_connect_timeout=timeout_s)
    deleted = 0
    try:
        batch: list[bytes] = []
        async for name in client.scan_iter(match=_pattern(key_prefix(namespace, job)), count=SCAN_BATCH):
            batch.append(name)
            if len(batch) >= SCAN_BATCH:
                deleted += await client.unlink(*batch)
                batch = []
        if batch:
            deleted += await client.unlink(*batch)
    finally:
        await client.aclose()
    return deleted
