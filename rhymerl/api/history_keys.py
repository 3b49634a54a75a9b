"""Where a job's rollout history lives in a shared Redis, and how its password reaches a process:
a contract between the history store the pods write (rhymerl.workers.history.redis_store) and the
operator's finalizer that deletes it when the RLJob goes (rhymerl.operator.reconcile.history).

Every key of job `<job>` in namespace `<namespace>` starts with `rhymerl:<namespace>:<job>:`. Jobs
share a Redis, so a job touches (and its cleanup deletes) that prefix only, never more.
"""

from __future__ import annotations

REDIS_PASSWORD_ENV = "RHYMERL_REDIS_PASSWORD"
"""The Redis password, given to pods from `history.redis_password_secret` (never in the URL: the
spec is stored in a ConfigMap)."""

LOCAL_NAMESPACE = "local"
"""The namespace of a job run by `rhymerl run` whose metadata names none."""


def history_key_prefix(namespace: str, job: str) -> str:
    """`rhymerl:<namespace>:<job>:`; names cannot hold ':' so one job's prefix never covers another's."""
    return f"rhymerl:{namespace}:{job}:"


def glob_escape(prefix: str) -> str:
    """`prefix` as a literal in a Redis SCAN MATCH pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix)
