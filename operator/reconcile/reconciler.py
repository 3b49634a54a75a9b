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
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.aio.client.exceptions import ApiException
from pydantic import ValidationError

from rhymerl.api.credentials import masked
from rhymerl.api.history_keys import (
    REDIS_ENDPOINTS_ENV,
    REDIS_PASSWORD_ENV,
    connect_problem,
    history_key_prefix,
    serves,
)
from rhymerl.api.spec import KIND, Condition, FailurePolicySpec, Failures, HistorySpec, RLJob, RLJobSpec
from rhymerl.operator.manifests import Owner, desired, replicas, selector_string
from rhymerl.operator.manifests.builders import ray_token_secret, stop_grace_s
from rhymerl.operator.manifests.labels import COMPONENT_KEY
from rhymerl.operator.manifests.roles import child_name
from rhymerl.operator.reconcile import conditions as cond
from rhymerl.operator.reconcile.autoscale import decide, with_rollout_replicas
from rhymerl.operator.reconcile.cluster import Cluster, now_rfc3339, owned_by
from rhymerl.operator.reconcile.diff import Manifest, pinned, plan, scaled_to_zero
from rhymerl.operator.reconcile.drain import drain
from rhymerl.operator.reconcile.history import CLEANUP_DEADLINE_S, FINALIZER, STOP_WAIT_S, delete_history
from rhymerl.operator.reconcile.lifecycle import (
    deadline,
    format_time,
    parse_time,
    sooner,
    suspension,
    ttl_left,
)
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
    """spec.failurePolicy.backoffLimit of a job whose spec does not validate (messages only)."""
    value = FailurePolicySpec.written(RLJobSpec.written(body.get("spec"), "failure_policy"), "backoff_limit")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return FailurePolicySpec().backoff_limit


def _awake(objects: Sequence[Manifest], job: RLJob, zero: Sequence[str]) -> list[Manifest]:
    """`objects` of a suspended `job` (every role at zero) with the roles not in `zero` at the replicas
    they run with: the other roles go on while the controller pod finishes its step (lifecycle.py)."""
    if not job.spec.suspend:
        return list(objects)
    running = job.model_copy(update={"spec": job.spec.model_copy(update={"suspend": False})})
    out = []
    for obj in objects:
        role = obj["metadata"].get("labels", {}).get(COMPONENT_KEY)
        if obj["kind"] == "StatefulSet" and role not in zero:
            obj = {**obj, "spec": {**obj["spec"], "replicas": replicas(running, role)}}
        out.append(obj)
    return out


def _finalizers(body: Mapping[str, Any]) -> list[str]:
    return list(body.get("metadata", {}).get("finalizers") or [])


async def _redis_password(cluster: Cluster, namespace: str, ref: Mapping[str, Any],
                          url: str) -> tuple[str | None, str | None]:
    """The Redis password of the job's history.redisPasswordSecret `ref`: the Secret's, when the operator
    may read it, else the operator's own (REDIS_PASSWORD_ENV), but only for a `url` that names the Redis
    that password is for (REDIS_ENDPOINTS_ENV): a job cannot have it sent to a host it names. Second:
    why there is none although the job names a Secret (None: no password needed, or one was found)."""
    if not ref.get("name"):
        return None, None
    key = ref.get("key", "redis-password")
    found = await cluster.read_secret(namespace, ref["name"], key)
    if found:
        return found, None
    own = os.environ.get(REDIS_PASSWORD_ENV)
    endpoints = os.environ.get(REDIS_ENDPOINTS_ENV, "")
    if own and serves(endpoints, url, namespace):
        return own, None
    theirs = (f"{REDIS_PASSWORD_ENV} is for {endpoints or 'no Redis named in ' + REDIS_ENDPOINTS_ENV}, not "
              f"{masked(url)}") if own else f"{REDIS_PASSWORD_ENV} is not set in the operator's environment"
    return None, (f"no Redis password: the Secret {namespace}/{ref['name']} (key {key}) is missing or the operator "
                  f"may not read it, and {theirs} (grant the operator get on that Secret, or give it the password "
                  "and the Redis it is for: docs/operations.md, \"Deleting a job\")")


def _with_degraded(previous: Mapping[str, Any], reason: str, message: str, now: str) -> list[dict[str, Any]]:
    """The status' conditions with Degraded True for `reason` (the rest as they are)."""
    out = [dict(c) for c in previous.get("conditions") or [] if c.get("type") != "Degraded"]
    old: dict[str, Any] = next((dict(c) for c in previous.get("conditions") or [] if c.get("type") == "Degraded"), {})
    flipped = old.get("status") != "True"
    out.append({**old, "type": "Degraded", "status": "True", "reason": reason, "message": message[:1024],
                "lastTransitionTime": now if flipped else old.get("lastTransitionTime", now)})
    return out


async def _finalize(cluster: Cluster, body: dict[str, Any], now: str) -> float | None:
    """The job is being deleted: stop its roles (their pods write history keys while they run), delete
    its history keys from Redis, then let it go. A cleanup that keeps failing (Redis unreachable, no
    password) is retried until CLEANUP_DEADLINE_S after the deletion began, saying why in the Degraded
    condition; then the finalizer is released anyway, with a Warning naming the keys left. Returns when
    to look again (waiting for the pods to stop), or None."""
    meta = body["metadata"]
    if FINALIZER not in _finalizers(body):
        return None
    namespace, name = meta["namespace"], meta["name"]
    history = (body.get("spec") or {}).get("history") or {}  # the job's spec need not validate any more
    url = HistorySpec.written(history, "redis_url")
    if history.get("store") == "redis" and isinstance(url, str) and url:
        clock = parse_time(now) or datetime.now(UTC)
        began = parse_time(meta.get("deletionTimestamp")) or clock
        elapsed = (clock - began).total_seconds()
        pods = await cluster.list_pods(namespace, name)
        if pods:
            for sts in await cluster.list_kind("StatefulSet", namespace, name):
                if int((sts.get("spec") or {}).get("replicas") or 0) > 0 and owned_by(sts, meta.get("uid", "")):
                    await cluster.scale_to_zero(namespace, sts["metadata"]["name"])
            if elapsed < STOP_WAIT_S:
                return float(min(REQUEUE_S, STOP_WAIT_S - elapsed))
        password, missing = await _redis_password(cluster, namespace,
                                                  HistorySpec.written(history, "redis_password_secret") or {}, url)
        prefix = history_key_prefix(namespace, name)
        try:
            if missing is not None:
                raise PermissionError(missing)
            deleted = await delete_history(url, namespace, name, password)
        except Exception as exc:  # Redis down, unreachable or refusing us: retry, for a while
            until = format_time(began + timedelta(seconds=CLEANUP_DEADLINE_S))
            why = f"cannot delete the job's history keys ({prefix}*) from {masked(url)}: {connect_problem(url, exc)}"
            if elapsed < CLEANUP_DEADLINE_S:
                message = (f"{why}; retrying until {until}, then the job goes and the keys stay "
                           f"(remove the finalizer {FINALIZER} to give up now)")
                await cluster.event(body, "Warning", "HistoryCleanupFailed", message)
                previous = body.get("status") or {}
                conditions = _with_degraded(previous, "HistoryCleanupFailed", message, now)
                if conditions != [dict(c) for c in previous.get("conditions") or []]:
                    await cluster.patch_status(namespace, name, {"conditions": conditions})
                raise
            await cluster.event(body, "Warning", "HistoryCleanupAbandoned",
                                f"{why}; gave up at {until} ({CLEANUP_DEADLINE_S} s after the deletion began) and "
                                f"released the finalizer: the keys stay (redis-cli --scan --pattern '{prefix}*' "
                                "lists them)")
        else:
            late = f" ({len(pods)} pods had not stopped by then)" if pods else ""
            await cluster.event(body, "Normal", "HistoryDeleted", f"deleted {deleted} history keys from Redis{late}")
    await cluster.set_finalizers(body, [f for f in _finalizers(body) if f != FINALIZER])
    return None


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
    stamp = now()
    clock = parse_time(stamp) or datetime.now(UTC)
    body = await cluster.get_job(namespace, name)
    if body is None:
        return Outcome(None)
    if body["metadata"].get("deletionTimestamp"):
        wait = await _finalize(cluster, body, stamp)
        return Outcome("Deleting", sum(cluster.writes.values()) - before, wait)
    meta = body["metadata"]
    uid = meta.get("uid", "")
    generation = int(meta.get("generation") or 0)
    parsed = parse(body)
    children = await cluster.list_children(namespace, name)
    pods = [view(p, cluster.node_disruption(p)) for p in await cluster.list_pods(namespace, name)]
    previous = body.get("status") or {}
    counted = count(_previous_failures(previous), pods,
                    [view(p, cluster.node_disruption(p), gone=True) for p in gone_pods])
    finished = bool((previous.get("progress") or {}).get("finished"))
    requeue: float | None = None
    refused: list[str] = []
    job = parsed.job
    if job is None:
        observation = cond.Observation(
            generation=generation, suspend=bool((body.get("spec") or {}).get("suspend")),
            backoff_limit=_raw_backoff_limit(body),
            desired=_replicas_by_role(children), pods=pods, failures=counted.failures, finished=finished,
            invalid=parsed.problems or "invalid spec", selector=str(previous.get("selector") or ""))
    else:
        left = ttl_left(job.spec.ttl_seconds_after_finished, previous, clock)
        if left is not None and left <= 0:
            await cluster.event(body, "Normal", "TTLExpired", f"{previous.get('phase')} for longer than "
                                f"spec.ttlSecondsAfterFinished {job.spec.ttl_seconds_after_finished} s: deleting the job")
            await cluster.delete_job(namespace, name)
            return Outcome("Deleting", sum(cluster.writes.values()) - before)
        await _sync_finalizer(cluster, body, job)
        limit = job.spec.failure_policy.backoff_limit
        owner = Owner(body.get("apiVersion", ""), KIND, name, uid)
        stage = suspension(job.spec.suspend, previous, sum(1 for p in pods if p.role == "controller"),
                           stop_grace_s(job, "controller"), clock)
        overdue = deadline(job.spec.active_deadline_seconds, job.spec.suspend or finished, previous, clock)
        objects = pinned(_awake(desired(job, owner), job, stage.zero()), children)
        scaling = decide(job.spec.rollout, previous, sum(1 for p in pods if p.role == "rollout" and p.unschedulable
                                                         and not p.deleting), clock)
        if scaling is not None:
            objects = with_rollout_replicas(objects, scaling.status.replicas)
        # a scale-down waits for the controller to move its workers off the pods that go (drain.py)
        draining = drain(child_name(name, "rollout"), _replicas_by_role(children).get("rollout", 0),
                         _replicas_by_role(objects).get("rollout", 0), previous, stop_grace_s(job, "rollout"), clock)
        objects = with_rollout_replicas(objects, draining.replicas)
        # the pods mount the job's Ray token: made once (a new one each pass would lock the pods out)
        await _write(refused, "Secret/ray-token", cluster.create_once(
            ray_token_secret(job, owner, secrets.token_hex(32))))
        if cond.over_budget(counted.failures, limit) or finished or overdue.exceeded is not None:
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
        requeue = sooner(REQUEUE_S if steps.requeue else None, stage.wait_s, overdue.wait_s, left,
                         None if scaling is None else scaling.wait_s, draining.wait_s)
        observation = cond.Observation(
            generation=generation, suspend=job.spec.suspend, backoff_limit=limit, desired=_replicas_by_role(objects),
            pods=pods, failures=counted.failures, finished=finished, selector=selector_string(name, "rollout"),
            refused=tuple(refused), suspension=stage, deadline_exceeded=overdue.exceeded,
            autoscaling=None if scaling is None else scaling.status,
            draining=(draining.status, draining.reason, draining.message))
    new = cond.status(observation, previous, stamp)
    if new != cond.operator_part(previous):
        if new["phase"] != previous.get("phase"):
            log.info("%s/%s: phase %s", namespace, name, new["phase"])
        gone = {k: None for k in cond.operator_part(previous) if k not in new}  # a merge patch drops them
        await cluster.patch_status(namespace, name, {**gone, **new})
        events = cond.transitions(previous.get("conditions") or [],
                                  [Condition.model_validate(c) for c in new["conditions"]])
        for event in events:
            await cluster.event(body, event.type, event.reason, event.message)
        for note in counted.notes:
            reason = {"crash": "PodCrashed", "restart": "PodRestarted"}.get(note.kind, "PodPreempted")
            await cluster.event(body, "Warning" if note.kind == "crash" else "Normal", reason, note.message)
    return Outcome(new["phase"], sum(cluster.writes.values()) - before, requeue)
