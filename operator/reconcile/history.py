"""A job's rollout history in Redis outlives its pods: the operator deletes it when the RLJob goes.

Key scheme: rhymerl.api.history_keys (every key of a job starts with `rhymerl:<namespace>:<job>:`,
then its run's id: each run deletes its own keys when it ends, a run that never ended leaves them);
the cleanup deletes by the job's prefix, so every run of the job, and never more. Garbage collection cannot do this (Redis is
not a Kubernetes object), which is why an RLJob with `history.store: redis` carries FINALIZER.

The Redis password: the job's `history.redis_password_secret`, read through the API when the operator
may get Secrets in the job's namespace; otherwise RHYMERL_REDIS_PASSWORD in the operator's own environment (the
Helm chart fills it from its Redis Secret, so the operator needs no permission on Secrets). With neither,
the cleanup cannot authenticate: it says so, and ends as any cleanup that keeps failing does.

Order and bounds (reconciler._finalize): the job's StatefulSets go to zero first, and the keys are
deleted once its pods are gone (they write keys while they run), or STOP_WAIT_S after the deletion
began; a failing cleanup is retried with backoff, Degraded saying why, until CLEANUP_DEADLINE_S after
the deletion began, when the finalizer is released with a Warning event naming the keys left behind.
Deletion never hangs on Redis.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from rhymerl.api.history_keys import glob_escape, history_key_prefix

FINALIZER = "rhymerl.io/history-cleanup"
STOP_WAIT_S = 120  # after the deletion began, for the job's pods to stop before its keys are deleted anyway
CLEANUP_DEADLINE_S = 600  # after the deletion began, when a cleanup that keeps failing releases the finalizer
SCAN_BATCH = 500


async def delete_history(url: str, namespace: str, job: str, password: str | None = None,
                         timeout_s: float = 10.0) -> int:
    """Delete every key of the job's history, all its runs', from the Redis at `url`; returns how many were
    deleted."""
    client = aioredis.Redis.from_url(url, password=password, socket_timeout=timeout_s,
                                     socket_connect_timeout=timeout_s)
    deleted = 0
    try:
        batch: list[bytes] = []
        async for name in client.scan_iter(match=glob_escape(history_key_prefix(namespace, job)) + "*", count=SCAN_BATCH):
            batch.append(name)
            if len(batch) >= SCAN_BATCH:
                deleted += await client.unlink(*batch)
                batch = []
        if batch:
            deleted += await client.unlink(*batch)
    finally:
        await client.aclose()
    return deleted
