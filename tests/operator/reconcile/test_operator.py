"""The operator against an in-process Kubernetes (kmock plus the cluster parts in kube_emulator.py), run as in a
cluster: kopf, the real API client, its own event loop. Each test stages one part of an RLJob's life."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import urllib.request
from datetime import datetime, timedelta
from typing import Any

import kmock
import pytest
import redis
from local_servers import free_port
from operator_harness import Kube, eventually

from rhymerl.api.roles import REJOIN_EXIT_CODE
from rhymerl.operator.reconcile.history import CLEANUP_DEADLINE_S, FINALIZER

pytestmark = pytest.mark.asyncio
NS = "team-a"
STS = "apps/v1/statefulsets"
RLJOBS = "rhymerl.io/v1alpha1/rljobs"
ALL_CHILDREN = sorted([
    ("configmaps", "alpha-spec"), ("poddisruptionbudgets", "alpha-rollout"), ("rolebindings", "alpha-controller"),
    ("roles", "alpha-controller"), ("serviceaccounts", "alpha-controller"),
    ("networkpolicies", "alpha-pods"), ("networkpolicies", "alpha-dist"), ("secrets", "alpha-ray-token"),
    *[("services", f"alpha-{r}") for r in ("controller", "rollout", "train", "reward", "history")],
    *[("statefulsets", f"alpha-{r}") for r in ("controller", "rollout", "train", "reward", "history")],
])


def sts(kube: Kube, name: str, namespace: str = NS) -> dict[str, Any]:
    found = kube.server.current(kmock.resource(STS), namespace, name)
    assert found is not None, name
    return found


async def patch_job(kube: Kube, name: str, patch: dict[str, Any], namespace: str = NS) -> None:
    await kube.cluster.request("PATCH", kube.cluster.path(RLJOBS, namespace, name), patch)


def status(kube: Kube, name: str, namespace: str = NS) -> dict[str, Any]:
    job = kube.job(namespace, name)
    assert job is not None
    found: dict[str, Any] = job.get("status") or {}
    return found


def metadata(kube: Kube, name: str, namespace: str = NS) -> dict[str, Any]:
    job = kube.job(namespace, name)
    assert job is not None
    found: dict[str, Any] = job["metadata"]
    return found


def event_reasons(kube: Kube, name: str, namespace: str = NS) -> list[str]:
    return [e["reason"] for e in kube.cluster.events(namespace, name)]


async def test_a_new_job_gets_every_child_owned_by_it_and_a_running_status(kube: Kube) -> None:
    async with kube.operator():
        created = await kube.create_job(NS, "alpha", {"rollout": {"replicas": 2, "maxReplicas": 4}})
        await kube.settle()
    assert kube.children(NS, "alpha") == ALL_CHILDREN
    for plural, name in ALL_CHILDREN:
        group = {"statefulsets": "apps/v1", "poddisruptionbudgets": "policy/v1", "roles": "rbac.authorization.k8s.io/v1",
                 "rolebindings": "rbac.authorization.k8s.io/v1",
                 "networkpolicies": "networking.k8s.io/v1"}.get(plural, "v1")
        obj = kube.server.current(kmock.resource(f"{group}/{plural}"), NS, name)
        assert obj is not None
        assert obj["metadata"]["ownerReferences"] == [{
            "apiVersion": "rhymerl.io/v1alpha1", "kind": "RLJob", "name": "alpha", "uid": created["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}]
    assert [p["metadata"]["name"] for p in kube.cluster.pods(NS, "alpha", "rollout")] == ["alpha-rollout-0",
                                                                                          "alpha-rollout-1"]
    st = status(kube, "alpha")
    assert st["phase"] == "Running"
    assert st["observedGeneration"] == 1
    assert st["roles"]["rollout"] == {"desired": 2, "ready": 2}
    assert st["roles"]["reward"] == {"desired": 0, "ready": 0}  # the built-in verifier runs in the controller
    assert st["replicas"] == 2
    assert st["selector"] == ("app.kubernetes.io/name=rhymerl,app.kubernetes.io/instance=alpha,"
                              "app.kubernetes.io/component=rollout")
    assert {c["type"]: c["status"] for c in st["conditions"]} == {
        "Ready": "True", "RolloutReady": "True", "TrainReady": "True", "Degraded": "False", "Suspended": "False",
        "Complete": "False", "Failed": "False", "Draining": "False", "Queued": "False"}
    assert {c["observedGeneration"] for c in st["conditions"]} == {1}
    assert "AllRolesReady" in event_reasons(kube, "alpha")
    assert "finalizers" not in metadata(kube, "alpha")  # memory history: nothing to clean up


async def test_a_pass_with_nothing_changed_writes_nothing_and_hand_edits_are_repaired(kube: Kube) -> None:
    async with kube.operator() as run:
        await kube.create_job(NS, "alpha")
        await kube.settle()
        before = len(kube.operator_writes())
        transition_times = [c["lastTransitionTime"] for c in status(kube, "alpha")["conditions"]]
        await run.resync()
        await run.resync()
        assert kube.operator_writes()[before:] == []
        assert [c["lastTransitionTime"] for c in status(kube, "alpha")["conditions"]] == transition_times
        await kube.cluster.request("PATCH", kube.cluster.path(STS, NS, "alpha-rollout"),
                                   {"spec": {"template": {"spec": {"containers": [{"name": "rollout", "image": "evil"}]}}}})
        await kube.cluster.request("DELETE", kube.cluster.path("v1/configmaps", NS, "alpha-spec"))
        await kube.settle()
        repaired = kube.operator_writes()[before:]
    assert sorted(w for w in repaired if "/rljobs/" not in w and "/events" not in w) == [  # the pod rolled twice
        f"PATCH /apis/apps/v1/namespaces/{NS}/statefulsets/alpha-rollout",
                                f"POST /api/v1/namespaces/{NS}/configmaps/alpha-spec"]
    container = sts(kube, "alpha-rollout")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/rhymerl/worker-cpu:0.1.0"  # no GPUs: no CUDA image
    assert container["args"] == ["worker", "--role", "rollout", "--spec", "/etc/rhymerl/spec.yaml"]
    assert ("configmaps", "alpha-spec") in kube.children(NS, "alpha")


async def test_kubectl_scale_sets_rollout_pods_within_min_and_max_replicas(kube: Kube) -> None:
    async with kube.operator():
        await kube.create_job(NS, "alpha", {"rollout": {"replicas": 1, "minReplicas": 1, "maxReplicas": 3}})
        await kube.settle()
        scale = kube.cluster.path(RLJOBS, NS, "alpha", "scale")
        answer = await kube.cluster.request("PATCH", scale, {"spec": {"replicas": 3}})
        assert answer["spec"]["replicas"] == 3
        await kube.settle()
        assert len(kube.cluster.pods(NS, "alpha", "rollout")) == 3
        assert (status(kube, "alpha")["replicas"], status(kube, "alpha")["roles"]["rollout"]) == (3, {"desired": 3,
                                                                                                     "ready": 3})
        assert (await kube.cluster.request("GET", scale))["status"]["replicas"] == 3
        await kube.cluster.request("PATCH", scale, {"spec": {"replicas": 10}})  # past max_replicas
        await kube.settle()
    assert sts(kube, "alpha-rollout")["spec"]["replicas"] == 3
    assert len(kube.cluster.pods(NS, "alpha", "rollout")) == 3
    assert status(kube, "alpha")["phase"] == "Running"
    assert status(kube, "alpha")["observedGeneration"] == 3


async def test_suspend_scales_every_role_to_zero_and_resume_brings_the_pods_back(kube: Kube) -> None:
    async with kube.operator():
        await kube.create_job(NS, "alpha")
        await kube.settle()
        await patch_job(kube, "alpha", {"spec": {"suspend": True}})
        await kube.settle()
        said = [e["reason"] for e in kube.cluster.events(NS, "alpha") if e["message"].startswith("Suspended=True")]
        assert said[0] == "CheckpointPending" and said[-1] == "Suspended"  # the controller pod first, then the rest
        assert set(said) <= {"CheckpointPending", "ScalingDown", "Suspended"}
        assert all(sts(kube, f"alpha-{r}")["spec"]["replicas"] == 0 for r in ("controller", "rollout", "train", "history"))
        assert kube.cluster.pods(NS, "alpha") == []
        assert status(kube, "alpha")["phase"] == "Suspended"
        assert kube.condition(NS, "alpha", "Suspended")["reason"] == "Suspended"
        assert kube.condition(NS, "alpha", "Ready")["reason"] == "Suspended"
        assert ("configmaps", "alpha-spec") in kube.children(NS, "alpha")  # the spec and claims stay
        await patch_job(kube, "alpha", {"spec": {"suspend": False}})
        await kube.settle()
    assert len(kube.cluster.pods(NS, "alpha")) == 4
    assert status(kube, "alpha")["phase"] == "Running"
    assert kube.condition(NS, "alpha", "Suspended")["status"] == "False"


async def test_a_spot_pod_preempted_is_replaced_and_counted_as_a_preemption_never_a_crash(kube: Kube) -> None:
    spot = {"enabled": True, "node_selector": {"cloud.google.com/gke-spot": "true"}}
    async with kube.operator():
        await kube.create_job(NS, "alpha", {"rollout": {"replicas": 2, "max_replicas": 2, "spot": spot}})
        await kube.settle()
        victim = kube.cluster.pod(NS, "alpha-rollout-1")
        assert victim is not None
        await kube.cluster.preempt(NS, "alpha-rollout-1")
        await kube.settle()
    replaced = kube.cluster.pod(NS, "alpha-rollout-1")
    assert replaced is not None and replaced["metadata"]["uid"] != victim["metadata"]["uid"]
    failures = status(kube, "alpha")["failures"]
    assert (failures["preemptions"], failures["crashes"]) == (1, 0)
    assert failures["lastFailure"].startswith("pod alpha-rollout-1: preempted (PreemptionByScheduler")
    assert status(kube, "alpha")["phase"] == "Running"
    assert kube.condition(NS, "alpha", "Failed")["status"] == "False"
    assert "PodPreempted" in event_reasons(kube, "alpha")


async def test_a_controller_waiting_for_pods_says_what_it_waits_for_and_the_job_stays_pending_not_failed(
        kube: Kube) -> None:
    import kubernetes.client

    from rhymerl.operator.progress import report_message

    api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(kube.server.url).rstrip("/")))
    async with kube.operator():
        await kube.create_job(NS, "alpha", {"rollout": {"replicas": 2, "max_replicas": 2}})
        await kube.settle()
        await kube.cluster.crash(NS, "alpha-train-0")  # no train pod: the controller cannot start the run
        await kube.settle()
        await asyncio.to_thread(report_message, api, NS, "alpha", "waiting for pods to join: 1 train")
        await kube.settle()
    st = status(kube, "alpha")
    assert st["progress"]["message"] == "waiting for pods to join: 1 train"
    assert st["phase"] == "Pending" and kube.condition(NS, "alpha", "Failed")["status"] == "False"


async def test_controller_restarts_and_member_pods_rejoining_count_no_crash_and_the_job_stays_running(
        kube: Kube) -> None:
    spec = {"rollout": {"replicas": 2, "max_replicas": 2}, "failure_policy": {"backoff_limit": 1}}
    members = ("alpha-rollout-0", "alpha-rollout-1", "alpha-train-0", "alpha-history-0")
    async with kube.operator():
        await kube.create_job(NS, "alpha", spec)
        await kube.settle()
        for _ in range(3):
            # the controller stopped after checkpointing its step (SIGTERM: a drain, an upgrade), exit 0
            await kube.cluster.restart(NS, "alpha-controller-0", exit_code=0, reason="Completed")
            for member in members:  # each asked to be restarted to join the next Ray head
                await kube.cluster.restart(NS, member, exit_code=REJOIN_EXIT_CODE, reason="Error")
            await kube.settle()
            assert status(kube, "alpha")["phase"] == "Running"
        failures = status(kube, "alpha")["failures"]
        assert (failures["crashes"], failures["restarts"]) == (0, 3 * (1 + len(members)))
        assert kube.condition(NS, "alpha", "Failed")["status"] == "False"
        assert kube.condition(NS, "alpha", "Degraded")["status"] == "False"
        assert "PodRestarted" in event_reasons(kube, "alpha") and "PodCrashed" not in event_reasons(kube, "alpha")
        # a real crash still counts: an OOM-killed controller is one crash, not one per member pod
        await kube.cluster.restart(NS, "alpha-controller-0", exit_code=137, reason="OOMKilled")
        await kube.settle()
        assert status(kube, "alpha")["failures"]["crashes"] == 1
        assert status(kube, "alpha")["phase"] == "Running"


async def test_a_crash_looping_pod_degrades_the_job_then_fails_it_past_the_backoff_limit(kube: Kube) -> None:
    spec = {"rollout": {"replicas": 2, "maxReplicas": 2}, "failurePolicy": {"backoffLimit": 1}}  # as the CRD has it
    async with kube.operator():
        await kube.create_job(NS, "alpha", spec)
        await kube.settle()
        await kube.cluster.crash(NS, "alpha-rollout-0", exit_code=137, reason="OOMKilled")
        await kube.settle()
        degraded = kube.condition(NS, "alpha", "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "CrashLoop")
        assert "pod alpha-rollout-0: container rollout exited 137 (OOMKilled)" in degraded["message"]
        assert kube.condition(NS, "alpha", "Failed")["status"] == "False"
        assert status(kube, "alpha")["failures"]["crashes"] == 1
        await kube.cluster.crash(NS, "alpha-rollout-0", exit_code=137, reason="OOMKilled")
        await kube.settle()
        failed = kube.condition(NS, "alpha", "Failed")
        assert (failed["status"], failed["reason"]) == ("True", "BackoffLimitExceeded")
        assert "2 crashes exceed spec.failurePolicy.backoffLimit 1" in failed["message"]
        assert "pod alpha-rollout-0: container rollout exited 137 (OOMKilled)" in failed["message"]
        assert status(kube, "alpha")["phase"] == "Failed"
        assert kube.cluster.pods(NS, "alpha") == []  # GPUs released; the spec and claims stay
        assert {"CrashLoop", "BackoffLimitExceeded", "PodCrashed"} <= set(event_reasons(kube, "alpha"))
        await patch_job(kube, "alpha", {"spec": {"failurePolicy": {"backoffLimit": 5}}})
        await kube.settle()
    assert status(kube, "alpha")["phase"] == "Running"
    assert status(kube, "alpha")["failures"]["crashes"] == 2


async def test_an_unschedulable_pod_shows_as_degraded_with_the_schedulers_message(kube: Kube) -> None:
    kube.cluster.capacity["rollout"] = 1
    async with kube.operator():
        await kube.create_job(NS, "alpha", {"rollout": {"replicas": 2, "max_replicas": 2}})
        await kube.settle()
        degraded = kube.condition(NS, "alpha", "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "Unschedulable")
        assert degraded["message"].startswith("pod alpha-rollout-1: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu")
        short = kube.condition(NS, "alpha", "RolloutReady")
        assert (short["reason"], short["message"]) == (
            "CapacityShort", "1/2 rollout pods ready; 1 wait for a node (alpha-rollout-1): the job goes on with 1")
        kube.cluster.capacity["rollout"] = 2  # a GPU node joins
        await kube.settle()
    assert kube.condition(NS, "alpha", "Degraded")["status"] == "False"
    assert kube.condition(NS, "alpha", "Ready")["status"] == "True"


async def test_an_invalid_spec_fails_naming_the_field_while_other_jobs_are_served(kube: Kube) -> None:
    async with kube.operator():
        await kube.create_job(NS, "broken", {"rollout": {"temperature": -1}})
        await kube.create_job("team-b", "fine")
        await kube.settle()
        failed = kube.condition(NS, "broken", "Failed")
        assert (failed["status"], failed["reason"]) == ("True", "InvalidSpec")
        assert failed["message"].startswith("spec.rollout.temperature: Input should be greater than or equal to 0")
        assert status(kube, "broken")["phase"] == "Failed"
        assert kube.children(NS, "broken") == []
        assert status(kube, "fine", "team-b")["phase"] == "Running"
        await patch_job(kube, "broken", {"spec": {"rollout": {"temperature": 0.7}}})
        await kube.settle()
    assert status(kube, "broken")["phase"] == "Running"
    assert len(kube.children(NS, "broken")) == 17  # no disruption budget for a single rollout pod


async def test_a_job_carrying_credentials_fails_invalid_spec_and_no_child_event_or_condition_shows_one(
        kube: Kube) -> None:
    secret = "s3cret-value"
    spec = {"rollout": {"pod": {"env": [{"name": "HF_TOKEN", "value": secret}]}},
            "train": {"pod": {"initContainers": [{"name": "warm", "image": "busybox:1.36",
                                                  "env": [{"name": "WANDB_API_KEY", "value": secret}]}]}},
            "history": {"store": "redis", "redisUrl": f"redis://r:6379/0?password={secret}"},
            "model": {"path": f"s3://AKIAEXAMPLE:{secret}@models/qwen"}}
    async with kube.operator():
        await kube.create_job(NS, "leaky", spec)
        await kube.settle()
    failed = kube.condition(NS, "leaky", "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "InvalidSpec")
    assert "spec.rollout.pod.env.0.value: HF_TOKEN holds a credential" in failed["message"]
    assert kube.children(NS, "leaky") == []
    shown = [status(kube, "leaky"), *kube.cluster.events(NS, "leaky")]
    shown += [obj.raw for (res, _, _), obj in kube.server.objects.items() if res.plural != "rljobs"]
    assert secret not in json.dumps(shown, default=str)


async def test_an_operator_restart_recreates_nothing_and_writes_nothing(kube: Kube) -> None:
    async with kube.operator():
        await kube.create_job(NS, "alpha")
        await kube.create_job("team-b", "beta", {"suspend": True})
        await kube.settle()
    uids = {(res.plural, ns, name): obj.raw["metadata"].get("uid") for (res, ns, name), obj in kube.server.objects.items()
            if not obj.deleted and res.plural not in ("events",)}
    before = len(kube.operator_writes())
    async with kube.operator() as run:
        await run.resync()
        await kube.settle()
        assert run.op.passes >= 2
    # a new operator process reads that each job's Ray token is its own from the job's spec ConfigMap (token.py)
    assert kube.operator_writes()[before:] == []
    assert {(res.plural, ns, name): obj.raw["metadata"].get("uid") for (res, ns, name), obj in kube.server.objects.items()
            if not obj.deleted and res.plural not in ("events",)} == uids


async def test_a_conflict_is_retried_and_the_job_still_converges(kube: Kube) -> None:
    conflicts = kube.server["patch", kmock.resource(RLJOBS), kmock.subresource("status")]
    conflicts[:2] << 409 << {"kind": "Status", "code": 409, "reason": "Conflict", "message": "the object has been modified"}
    async with kube.operator() as run:
        await kube.create_job(NS, "alpha")
        await kube.settle()
        errors = run.op.metrics.text().decode()
    assert status(kube, "alpha")["phase"] == "Running"
    assert re.search(r'rhymerl_operator_reconcile_errors_total\{type="ConflictException_409"\} [12]\.0', errors)


async def test_deleting_a_job_with_redis_history_deletes_its_keys_and_no_one_elses(kube: Kube, redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    mine = [f"rhymerl:{NS}:alpha:{k}" for k in ("index:0", "index:1", "meta")]
    others = [f"rhymerl:{NS}:alpha-2:index:0", "rhymerl:team-b:alpha:index:0", "unrelated"]
    for key in mine + others:
        r.set(key, b"x")
    history = {"store": "redis", "redis_url": redis_url}
    async with kube.operator():
        await kube.create_job(NS, "alpha", {"history": history})
        await kube.settle()
        assert metadata(kube, "alpha")["finalizers"] == [FINALIZER]
        await kube.cluster.request("DELETE", kube.cluster.path(RLJOBS, NS, "alpha"))
        await kube.settle()  # the roles are stopped first: their pods write keys while they run
        await eventually(lambda: kube.job(NS, "alpha") is None, what="the job to go")
        await kube.settle()
    assert [k for k in mine if r.exists(k)] == []
    assert [k for k in others if r.exists(k)] == others
    assert kube.children(NS, "alpha") == [] and kube.cluster.pods(NS, "alpha") == []
    assert "HistoryDeleted" in event_reasons(kube, "alpha")
    r.close()


async def test_the_operator_serves_metrics_and_a_health_endpoint(kube: Kube) -> None:
    health, metrics = free_port(), free_port()
    async with kube.operator(health_port=health, metrics_port=metrics):
        await kube.create_job(NS, "alpha")
        await kube.settle()

        def get(url: str) -> tuple[int, str]:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()

        code, body = await asyncio.to_thread(get, f"http://127.0.0.1:{health}/healthz")
        assert code == 200 and '"resync"' in body
        code, body = await asyncio.to_thread(get, f"http://127.0.0.1:{metrics}/metrics")
    assert code == 200
    assert re.search(r'rhymerl_operator_reconciles_total\{result="ok"\} [1-9]', body)
    assert 'rhymerl_operator_jobs{phase="Running"} 1.0' in body
    assert re.search(r'rhymerl_operator_writes_total\{kind="StatefulSet",verb="apply"\} 5\.0', body)
    assert "rhymerl_operator_reconcile_seconds_count" in body


async def test_the_controller_pods_progress_report_changes_only_status_progress_and_finishing_completes_the_job(
        kube: Kube) -> None:
    from datetime import UTC, datetime

    import kubernetes.client

    from rhymerl.operator.progress import report

    api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(kube.server.url).rstrip("/")))
    row = {"step": 7, "epoch": 2, "policy_version": 7, "reward_mean": 0.625, "spec_acceptance": 0.8,
           "time_rollout_s": 1.5, "time_reward_s": 0.25, "time_train_s": 0.75, "loss": float("nan")}
    async with kube.operator() as run:
        await kube.create_job(NS, "alpha")
        await kube.settle()
        before = status(kube, "alpha")
        await asyncio.to_thread(report, api, NS, "alpha", row, now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
        after = status(kube, "alpha")
        assert after.pop("progress") == {"step": 7, "epoch": 2, "policyVersion": 7, "rewardMean": 0.625,
                                         "acceptanceRate": 0.8, "lastStepSeconds": 2.5, "message": "step 7 done",
                                         "updatedAt": "2026-01-02T03:04:05Z", "finished": False}
        assert after == before
        writes = len(kube.operator_writes())
        await run.resync()
        assert kube.operator_writes()[writes:] == []  # the operator leaves progress alone
        await asyncio.to_thread(report, api, NS, "alpha", {**row, "step": 8}, finished=True)
        await kube.settle()
    assert status(kube, "alpha")["progress"]["step"] == 8
    assert status(kube, "alpha")["phase"] == "Succeeded"
    assert kube.condition(NS, "alpha", "Complete")["status"] == "True"
    assert kube.cluster.pods(NS, "alpha") == []
    api.close()


async def test_the_history_cleanup_reads_the_redis_password_from_the_jobs_secret(
        kube: Kube, redis_with_password: tuple[str, str]) -> None:
    url, password = redis_with_password
    r = redis.Redis.from_url(url, password=password)
    r.set(f"rhymerl:{NS}:alpha:meta", b"x")
    r.set(f"rhymerl:{NS}:beta:meta", b"x")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "redis-auth", "namespace": NS},
              "data": {"redis-password": base64.b64encode(password.encode()).decode()}}
    await kube.cluster.request("POST", kube.cluster.path("v1/secrets", NS), secret)
    history = {"store": "redis", "redis_url": url, "redis_password_secret": {"name": "redis-auth"}}
    async with kube.operator():
        await kube.create_job(NS, "alpha", {"history": history})
        await kube.settle()
        await kube.cluster.request("DELETE", kube.cluster.path(RLJOBS, NS, "alpha"))
        await kube.settle()
        await eventually(lambda: kube.job(NS, "alpha") is None, what="the job to go")
    assert (r.exists(f"rhymerl:{NS}:alpha:meta"), r.exists(f"rhymerl:{NS}:beta:meta")) == (0, 1)
    r.close()


async def test_a_job_whose_redis_is_unreachable_keeps_its_finalizer_saying_why_until_the_cleanup_gives_up(
        kube: Kube) -> None:
    history = {"store": "redis", "redis_url": f"redis://127.0.0.1:{free_port()}/0"}  # nothing listens there
    async with kube.operator() as run:
        await kube.create_job(NS, "alpha", {"history": history})
        await kube.settle()
        await kube.cluster.request("DELETE", kube.cluster.path(RLJOBS, NS, "alpha"))
        await kube.settle()
        await eventually(lambda: "HistoryCleanupFailed" in event_reasons(kube, "alpha"), what="the warning")
        assert kube.cluster.pods(NS, "alpha") == []  # stopped before any key was touched
        assert metadata(kube, "alpha")["finalizers"] == [FINALIZER]
        degraded = kube.condition(NS, "alpha", "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "HistoryCleanupFailed")
        began = datetime.fromisoformat(metadata(kube, "alpha")["deletionTimestamp"].replace("Z", "+00:00"))
        gave_up = began + timedelta(seconds=CLEANUP_DEADLINE_S + 1)  # a second on: the clock reads whole seconds
        run.op.now = lambda: gave_up.strftime("%Y-%m-%dT%H:%M:%SZ")
        await run.resync()
        await eventually(lambda: kube.job(NS, "alpha") is None, what="the job to go")
    assert "HistoryCleanupAbandoned" in event_reasons(kube, "alpha")


async def test_a_write_the_api_server_refuses_is_reported_and_the_other_children_are_still_written(
        kube: Kube) -> None:
    refusal = {"kind": "Status", "code": 403, "reason": "Forbidden",
               "message": 'statefulsets.apps "alpha-rollout" is forbidden: exceeded quota'}
    refused = kube.server["post", kmock.resource(STS), kmock.name("alpha-rollout")]
    refused[:1] << 403 << refusal
    async with kube.operator():
        await kube.create_job(NS, "alpha")
        await kube.settle()
    history = kube.server.objects[kmock.resource(RLJOBS), NS, "alpha"].history
    degraded = [c for version in history if version is not None
                for c in (version.get("status") or {}).get("conditions", []) if c["type"] == "Degraded"]
    assert degraded[0]["reason"] == "ApplyFailed"
    assert degraded[0]["message"] == 'StatefulSet/alpha-rollout: statefulsets.apps "alpha-rollout" is forbidden: ' \
                                     "exceeded quota"
    assert len(kube.children(NS, "alpha")) == 17
