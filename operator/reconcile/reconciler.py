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
from rhymerl.api.services import HistorySpec
from rhymerl.api.spec import KIND, FailurePolicySpec, RLJob, RLJobSpec
from rhymerl.api.status import Condition, Failures
from rhymerl.operator.manifests import Owner, desired, replicas, selector_string
from rhymerl.operator.manifests.access import ray_token_name, ray_token_secret
from rhymerl.operator.manifests.containers import stop_grace_s
from rhymerl.operator.manifests.labels import COMPONENT_KEY
from rhymerl.operator.manifests.roles import child_name
from rhymerl.operator.reconcile import admission, token
from rhymerl.operator.reconcile import conditions as cond
from rhymerl.operator.reconcile.autoscale import decide, with_rollout_replicas
from rhymerl.operator.reconcile.cluster import Cluster, now_rfc3339, owned_by
from rhymerl.operator.reconcile.diff import Manifest, Plan, pinned, plan, scaled_to_zero
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
from rhymerl.operator.reconcile.pods import Count, PodView, count, view
from rhymerl.operator.reconcile.release import on_its_release, pin_source
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


async def _ray_token(cluster: Cluster, refused: list[str], job: RLJob, owner: Owner, body: Mapping[str, Any],
                     children: Sequence[Manifest], clock: datetime) -> token.Token:
    """The job's Ray token Secret, which its pods mount: created once for the job's uid (a new token each
    pass would lock the running pods out), never an earlier job's of the same name taken over (token.py)."""
    name = job.metadata.name
    if token.recorded(name, owner.uid, children):
        return token.Token(True)
    try:
        created = await cluster.create_once(ray_token_secret(job, owner, secrets.token_hex(32)))
    except ApiException as exc:
        reason = _refusal(exc)
        if reason is None:
            raise
        refused.append(f"Secret/{ray_token_name(name)}: {reason}")
        return token.Token(False, None, token.WAIT_OLD_S)
    born = parse_time(body["metadata"].get("creationTimestamp"))
    return token.decide(name, owner.uid, created, False, (clock - born).total_seconds() if born else 0.0)


async def _converge(cluster: Cluster, body: Mapping[str, Any], steps: Plan, children: Sequence[Manifest],
                    refused: list[str]) -> None:
    """Make the writes of `steps` for the job `body`: never onto an object that is not the job's (an
    apply would take a person's or another job's object of the same name over; a delete would remove it),
    what the API server refuses for good added to `refused`."""
    namespace, name, uid = body["metadata"]["namespace"], body["metadata"]["name"], body["metadata"].get("uid", "")
    listed = {(c["kind"], c["metadata"]["name"]) for c in children}
    for obj in steps.apply:
        what = f"{obj['kind']}/{obj['metadata']['name']}"
        other = None if (obj["kind"], obj["metadata"]["name"]) in listed else await cluster.someone_elses(obj, uid)
        if other is not None:  # the job waits, saying whose name it needs
            refused.append(f"{what}: exists and is not this job's ({other}); delete or rename it")
            continue
        log.info("%s/%s: applying %s", namespace, name, what)
        await _write(refused, what, cluster.apply(obj))
    for ref in steps.delete:
        current = next((c for c in children if (c["kind"], c["metadata"]["name"]) == (ref.kind, ref.name)), None)
        if current is not None and owned_by(current, uid):
            log.info("%s/%s: deleting %s/%s (%s)", namespace, name, ref.kind, ref.name, ref.reason)
            await _write(refused, f"{ref.kind}/{ref.name}", cluster.delete(namespace, ref))


@dataclass(frozen=True)
class _Seen:
    """What one pass read of a job: its children, its pods and their failure count, its last status."""

    children: list[Manifest]
    pods: list[PodView]
    counted: Count
    previous: Mapping[str, Any]
    finished: bool


async def _look(cluster: Cluster, body: Mapping[str, Any], gone_pods: Sequence[Mapping[str, Any]]) -> _Seen:
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    children = await cluster.list_children(namespace, name)
    pods = [view(p, cluster.node_disruption(p)) for p in await cluster.list_pods(namespace, name)]
    previous = body.get("status") or {}
    counted = count(_previous_failures(previous), pods,
                    [view(p, cluster.node_disruption(p), gone=True) for p in gone_pods])
    return _Seen(children, pods, counted, previous, bool((previous.get("progress") or {}).get("finished")))


async def _run_job(cluster: Cluster, body: Mapping[str, Any], job: RLJob, seen: _Seen,
                   clock: datetime) -> tuple[cond.Observation, float | None]:
    """One pass over a valid job that is not being deleted: its children written, what its status says."""
    name, uid = job.metadata.name, body["metadata"].get("uid", "")
    children, pods, previous = seen.children, seen.pods, seen.previous
    refused: list[str] = []
    limit = job.spec.failure_policy.backoff_limit
    owner = Owner(body.get("apiVersion", ""), KIND, name, uid)
    stage = suspension(job.spec.suspend, previous, sum(1 for p in pods if p.role == "controller"),
                       stop_grace_s(job, "controller"), clock)
    overdue = deadline(job.spec.active_deadline_seconds, job.spec.suspend or seen.finished, previous, clock)
    built = on_its_release(desired(job, owner), job, body.get("spec") or {}, children)
    objects = pinned(_awake(built, job, stage.zero()), children, pin_source(body, job))
    scaling = decide(job.spec.rollout, previous, sum(1 for p in pods if p.role == "rollout" and p.unschedulable
                                                     and not p.deleting), clock)
    if scaling is not None:
        objects = with_rollout_replicas(objects, scaling.status.replicas)
    # a scale-down waits for the controller to move its workers off the pods that go (drain.py)
    draining = drain(child_name(name, "rollout"), _replicas_by_role(children).get("rollout", 0),
                     _replicas_by_role(objects).get("rollout", 0), previous, stop_grace_s(job, "rollout"), clock)
    objects = with_rollout_replicas(objects, draining.replicas)
    ray_token = await _ray_token(cluster, refused, job, owner, body, children, clock)
    if cond.over_budget(seen.counted.failures, limit) or seen.finished or overdue.exceeded is not None:
        objects = scaled_to_zero(objects)
    steps = plan(token.with_record(objects, name, uid) if ray_token.ours else token.held(objects), children)
    await _converge(cluster, body, steps, children, refused)
    requeue = sooner(REQUEUE_S if steps.requeue else None, ray_token.wait_s, stage.wait_s, overdue.wait_s,
                     ttl_left(job.spec.ttl_seconds_after_finished, previous, clock),
                     None if scaling is None else scaling.wait_s, draining.wait_s)
    shorts = admission.short(children, [p.name for p in pods])  # pods refused at admission: admission.py
    failed = [e for s in shorts for e in await cluster.list_events(body["metadata"]["namespace"], s.field_selector())]
    return cond.Observation(
        pods_refused=admission.refusals(failed, shorts),
        generation=int(body["metadata"].get("generation") or 0), suspend=job.spec.suspend, backoff_limit=limit,
        desired=_replicas_by_role(objects), pods=pods, failures=seen.counted.failures, finished=seen.finished,
        selector=selector_string(name, "rollout"), refused=tuple(refused), token_pending=ray_token.message,
        suspension=stage, deadline_exceeded=overdue.exceeded, autoscaling=None if scaling is None else scaling.status,
        draining=(draining.status, draining.reason, draining.message)), requeue


async def _publish(cluster: Cluster, body: Mapping[str, Any], seen: _Seen, new: dict[str, Any]) -> None:
    """Patch the status to `new` where it changed, with an Event per condition that moved and per failure
    counted."""
    previous = seen.previous
    if new == cond.operator_part(previous):
        return
    if new["phase"] != previous.get("phase"):
        log.info("%s/%s: phase %s", body["metadata"]["namespace"], body["metadata"]["name"], new["phase"])
    gone = {k: None for k in cond.operator_part(previous) if k not in new}  # a merge patch drops them
    await cluster.patch_status(body["metadata"]["namespace"], body["metadata"]["name"], {**gone, **new})
    events = cond.transitions(previous.get("conditions") or [], [Condition.model_validate(c) for c in new["conditions"]])
    for event in events:
        await cluster.event(body, event.type, event.reason, event.message)
    for note in seen.counted.notes:
        reason = {"crash": "PodCrashed", "restart": "PodRestarted"}.get(note.kind, "PodPreempted")
        await cluster.event(body, "Warning" if note.kind == "crash" else "Normal", reason, note.message)


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
    parsed = parse(body)
    seen = await _look(cluster, body, gone_pods)
    requeue: float | None = None
    job = parsed.job
    if job is None:
        observation = cond.Observation(
            generation=int(body["metadata"].get("generation") or 0),
            suspend=bool((body.get("spec") or {}).get("suspend")), backoff_limit=_raw_backoff_limit(body),
            desired=_replicas_by_role(seen.children), pods=seen.pods, failures=seen.counted.failures,
            finished=seen.finished, invalid=parsed.problems or "invalid spec",
            selector=str(seen.previous.get("selector") or ""))
    else:
        left = ttl_left(job.spec.ttl_seconds_after_finished, seen.previous, clock)
        if left is not None and left <= 0:
            await cluster.event(body, "Normal", "TTLExpired", f"{seen.previous.get('phase')} for longer than "
                                f"spec.ttlSecondsAfterFinished {job.spec.ttl_seconds_after_finished} s: deleting the job")
            await cluster.delete_job(namespace, name)
            return Outcome("Deleting", sum(cluster.writes.values()) - before)
        await _sync_finalizer(cluster, body, job)
        observation, requeue = await _run_job(cluster, body, job, seen, clock)
    new = cond.status(observation, seen.previous, stamp)
    await _publish(cluster, body, seen, new)
    return Outcome(new["phase"], sum(cluster.writes.values()) - before, requeue)
