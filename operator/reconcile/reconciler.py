"""One reconcile pass of one RLJob: read everything fresh, converge the children, write the status.

Level-based: a pass depends only on what the API server holds now (plus pods seen deleted since the
last pass), never on which event woke it, so a missed event, a conflict or an operator restart is
repaired by the next pass. The decisions are pure (validate, manifests.desired, diff.plan, pods.count,
conditions.status); this module only reads, calls them and writes what they say. A pass with nothing
changed writes nothing: no apply, no status patch, no event.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.aio.client.exceptions import ApiException
from pydantic import ValidationError

from rhymerl.api.history_keys import REDIS_PASSWORD_ENV, redacted
from rhymerl.api.spec import KIND, Condition, FailurePolicySpec, Failures, RLJob
from rhymerl.operator.manifests import Owner, desired, selector_string
from rhymerl.operator.manifests.labels import COMPONENT_KEY
from rhymerl.operator.reconcile import conditions as cond
from rhymerl.operator.reconcile.cluster import Cluster, now_rfc3339, owned_by
from rhymerl.operator.reconcile.diff import Manifest, plan, scaled_to_zero
from rhymerl.operator.reconcile.history import FINALIZER, delete_history
from rhymerl.operator.reconcile.pods import count, view
from rhymerl.operator.reconcile.validate import parse

log = logging.getLogger(__name__)
# A replaced child is gone within seconds; look again soon rather than at the next resync.
REQUEUE_S = 2.0


@dataclass(frozen=True)
class Outcome:
    """What a pass did: the job's phase (None: the job is gone), its writes, and when to look again
    sooner than the periodic resync (None: no need)."""

    phase: str | None
    writes: int = 0
    requeue_after: float | None = None


def _replicas_by_role(objects: Sequence[Manifest]) -> dict[str, int]:
    return {obj["metadata"]["labels"].get(COMPONENT_KEY, ""): int(obj["spec"].get("replicas") or 0)
            for obj in objects if obj["kind"] == "StatefulSet"}


def _previous_failures(status: Mapping[str, Any]) -> Failures:
    try:
        return Failures.model_validate(status.get("failures") or {})
    except ValidationError:  # hand-edited status: start counting again rather than stop serving the job
        return Failures()


def _raw_backoff_limit(body: Mapping[str, Any]) -> int:
    """spec.failure_policy.backoff_limit of a job whose spec does not validate (messages only)."""
    value = ((body.get("spec") or {}).get("failure_policy") or {}).get("backoff_limit")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return FailurePolicySpec().backoff_limit


def _finalizers(body: Mapping[str, Any]) -> list[str]:
    return list(body.get("metadata", {}).get("finalizers") or [])


async def _finalize(cluster: Cluster, body: dict[str, Any]) -> None:
    """The job is being deleted: delete its history keys from Redis, then let it go."""
    meta = body["metadata"]
    if FINALIZER not in _finalizers(body):
        return
    history = (body.get("spec") or {}).get("history") or {}
    url = history.get("redis_url")
    if history.get("store") == "redis" and isinstance(url, str) and url:
        secret = history.get("redis_password_secret") or {}
        password = None
        if secret.get("name"):
            password = await cluster.read_secret(meta["namespace"], secret["name"], secret.get("key", "redis-password"))
            password = password or os.environ.get(REDIS_PASSWORD_ENV) or None
        try:
            deleted = await delete_history(url, meta["namespace"], meta["name"], password)
        except Exception as exc:  # Redis down or unreachable: keep the finalizer and try again
            await cluster.event(body, "Warning", "HistoryCleanupFailed",
                                f"cannot delete the job's history keys from {redacted(url)}: {exc}; "
                                f"retrying (remove the finalizer {FINALIZER} by hand to give up)")
            raise
        await cluster.event(body, "Normal", "HistoryDeleted", f"deleted {deleted} history keys from Redis")
    await cluster.set_finalizers(body, [f for f in _finalizers(body) if f != FINALIZER])


async def _sync_finalizer(cluster: Cluster, body: dict[str, Any], job: RLJob) -> None:
    """FINALIZER is on the job exactly when its history lives in Redis."""
    have = _finalizers(body)
    want_it = job.spec.history.store == "redis"
    if want_it and FINALIZER not in have:
        await cluster.set_finalizers(body, [*have, FINALIZER])
    elif not want_it and FINALIZER in have:
        await cluster.set_finalizers(body, [f for f in have if f != FINALIZER])


def _refusal(exc: ApiException) -> str | None:
    """The API server's message when it refused a write for good (forbidden, invalid, denied by a webhook
    or a quota); None for what a retry may fix (conflicts, throttling, server errors)."""
    if exc.status not in (400, 403, 404, 422):
        return None
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or exc.reason or exc.status)


async def _write(refused: list[str], what: str, write: Awaitable[Any]) -> None:
    try:
        await write
    except ApiException as exc:
        reason = _refusal(exc)
        if reason is None:
            raise
        refused.append(f"{what}: {reason}")


async def reconcile(cluster: Cluster, namespace: str, name: str, gone_pods: Sequence[Mapping[str, Any]] = (),
                    now: Callable[[], str] = now_rfc3339) -> Outcome:
    """Converge RLJob `namespace/name` and its status. `gone_pods`: bodies of the job's pods seen deleted
    since the last pass (a pod preempted and replaced between two passes still counts once)."""
    before = sum(cluster.writes.values())
    body = await cluster.get_job(namespace, name)
    if body is None:
        return Outcome(None)
    if body["metadata"].get("deletionTimestamp"):
        await _finalize(cluster, body)
        return Outcome("Deleting", sum(cluster.writes.values()) - before)
    meta = body["metadata"]
    uid = meta.get("uid", "")
    generation = int(meta.get("generation") or 0)
    parsed = parse(body)
    children = await cluster.list_children(namespace, name)
    pods = [view(p) for p in await cluster.list_pods(namespace, name)]
    previous = body.get("status") or {}
    counted = count(_previous_failures(previous), pods, [view(p) for p in gone_pods])
    finished = bool((previous.get("progress") or {}).get("finished"))
    requeue = None
    refused: list[str] = []
    job = parsed.job
    if job is None:
        observation = cond.Observation(
            generation=generation, suspend=bool((body.get("spec") or {}).get("suspend")),
            backoff_limit=_raw_backoff_limit(body),
            desired=_replicas_by_role(children), pods=pods, failures=counted.failures, finished=finished,
            invalid=parsed.problems or "invalid spec", selector=str(previous.get("selector") or ""))
    else:
        await _sync_finalizer(cluster, body, job)
        limit = job.spec.failure_policy.backoff_limit
        objects = desired(job, Owner(body.get("apiVersion", ""), KIND, name, uid))
        if cond.over_budget(counted.failures, limit) or finished:
            objects = scaled_to_zero(objects)
        steps = plan(objects, children)
        for obj in steps.apply:
            what = f"{obj['kind']}/{obj['metadata']['name']}"
            log.info("%s/%s: applying %s", namespace, name, what)
            await _write(refused, what, cluster.apply(obj))
        for ref in steps.delete:
            current = next((c for c in children if (c["kind"], c["metadata"]["name"]) == (ref.kind, ref.name)), None)
            if current is not None and owned_by(current, uid):  # never another job's (or a person's) object
                log.info("%s/%s: deleting %s/%s (%s)", namespace, name, ref.kind, ref.name, ref.reason)
                await _write(refused, f"{ref.kind}/{ref.name}", cluster.delete(namespace, ref))
        if steps.requeue:
            requeue = REQUEUE_S
        observation = cond.Observation(
            generation=generation, suspend=job.spec.suspend, backoff_limit=limit, desired=_replicas_by_role(objects),
            pods=pods, failures=counted.failures, finished=finished, selector=selector_string(name, "rollout"),
            refused=tuple(refused))
    new = cond.status(observation, previous, now())
    if new != cond.operator_part(previous):
        if new["phase"] != previous.get("phase"):
            log.info("%s/%s: phase %s", namespace, name, new["phase"])
        await cluster.patch_status(namespace, name, new)
        events = cond.transitions(previous.get("conditions") or [],
                                  [Condition.model_validate(c) for c in new["conditions"]])
        for event in events:
            await cluster.event(body, event.type, event.reason, event.message)
        for note in counted.notes:
            reason = {"crash": "PodCrashed", "restart": "PodRestarted"}.get(note.kind, "PodPreempted")
            await cluster.event(body, "Warning" if note.kind == "crash" else "Normal", reason, note.message)
    return Outcome(new["phase"], sum(cluster.writes.values()) - before, requeue)
