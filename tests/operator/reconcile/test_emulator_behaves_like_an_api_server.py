"""The kube emulator does what a real API server and its controllers do, where the operator relies on it;
each test names the Kubernetes (or Kueue) source or document that says so. No operator runs here: the requests are
the fixture's own, and `Cluster.step` plays the controllers."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import structural
from operator_harness import Kube
from pod_security import ENFORCE_LABEL
from statefulset_controller import KUEUE_GATE, KUEUE_MANAGED, REVISION

from rhymerl.api.crd import TRANSITION_SPEC, crd
from rhymerl.api.placement import WORKER_CPU_IMAGE
from rhymerl.api.spec import API_VERSION, KIND
from rhymerl.operator.manifests.labels import KUEUE_GROUP_LABEL

NS = "team-a"
RLJOBS = "rhymerl.io/v1alpha1/rljobs"
STS = "apps/v1/statefulsets"
PVCS = "v1/persistentvolumeclaims"
PODS = "v1/pods"
QUOTAS = "v1/resourcequotas"


def _job(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": NS}, "spec": spec}


def _stored(kube: Kube, name: str) -> dict[str, Any]:
    found = kube.server.current(RLJOBS, NS, name)
    assert found is not None
    return found


def _with_default(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """The chart's CRD with one more defaulted property under spec (what a new release's CRD adds)."""
    body = crd()
    node = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in path[:-1]:
        node = node["properties"][part]
    node["properties"][path[-1]] = {"type": "string", "default": value}
    return body


def _sts(name: str, image: str, policy: str = "Retain", replicas: int = 2) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "serviceName": name, "selector": {"matchLabels": labels},
                     "updateStrategy": {"type": "RollingUpdate"},
                     "persistentVolumeClaimRetentionPolicy": {"whenDeleted": policy, "whenScaled": "Retain"},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "main", "image": image}]}},
                     "volumeClaimTemplates": [{"metadata": {"name": "data"},
                                               "spec": {"resources": {"requests": {"storage": "1Gi"}}}}]}}


def test_pruning_drops_unknown_fields_but_keeps_the_roots_and_what_preserve_unknown_fields_covers() -> None:
    """apiextensions-apiserver pkg/apiserver/schema/pruning/algorithm.go, Prune."""
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "a": {"type": "integer"}, "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "tags": {"type": "object", "additionalProperties": {"type": "string"}}}}}}
    obj = {"apiVersion": "v", "kind": "K", "metadata": {"name": "x"}, "junk": 1,
           "spec": {"a": 1, "b": 2, "free": {"anything": {"deep": 1}}, "tags": {"k": "v"}}}
    assert structural.stored(obj, schema) == {"apiVersion": "v", "kind": "K", "metadata": {"name": "x"},
                                              "spec": {"a": 1, "free": {"anything": {"deep": 1}}, "tags": {"k": "v"}}}


def test_defaulting_fills_missing_and_non_nullable_null_properties_then_the_blocks_it_defaulted() -> None:
    """apiextensions-apiserver pkg/apiserver/schema/defaulting/algorithm.go, Default."""
    schema = {"type": "object", "properties": {"spec": {"type": "object", "default": {}, "properties": {
        "n": {"type": "integer", "default": 3}, "opt": {"type": "string", "nullable": True, "default": "d"},
        "block": {"type": "object", "default": {}, "properties": {"x": {"type": "integer", "default": 7}}}}}}}
    assert structural.stored({}, schema) == {"spec": {"n": 3, "opt": "d", "block": {"x": 7}}}
    assert structural.stored({"spec": {"n": None, "opt": None}}, schema)["spec"] == {"n": 3, "opt": None,
                                                                                     "block": {"x": 7}}


@pytest.mark.asyncio
async def test_an_rljob_is_stored_pruned_and_with_every_default_of_the_crd_the_chart_ships(kube: Kube) -> None:
    """CRD defaulting and pruning on create (kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/
    custom-resource-definitions/#defaulting, #field-pruning)."""
    await kube.cluster.request("POST", kube.cluster.path(RLJOBS, NS), _job("alpha", {"rollout": {"replicas": 1},
                                                                                     "nonsense": True}))
    spec = _stored(kube, "alpha")["spec"]
    assert "nonsense" not in spec
    assert spec["images"]["controller"] == WORKER_CPU_IMAGE  # the API server keeps the default: the upgrade case
    assert spec["rollout"]["maxReplicas"] == 1 and "speculation" in spec["rollout"]


@pytest.mark.asyncio
async def test_a_crd_that_preserves_unknown_fields_keeps_a_spec_as_written(kube: Kube) -> None:
    kube.server.install_crd(crd(transition=True))
    assert TRANSITION_SPEC["x-kubernetes-preserve-unknown-fields"]
    await kube.cluster.request("POST", kube.cluster.path(RLJOBS, NS), _job("alpha", {"algorithm": {"kl_coef": 0.1}}))
    assert _stored(kube, "alpha")["spec"] == {"algorithm": {"kl_coef": 0.1}}


@pytest.mark.asyncio
async def test_a_new_crds_defaults_are_served_on_read_and_stored_only_at_the_objects_next_write(kube: Kube) -> None:
    """"Defaults applied when reading data from etcd are not automatically written back to etcd" (the
    defaulting section cited above)."""
    await kube.cluster.request("POST", kube.cluster.path(RLJOBS, NS), _job("alpha", {}))
    kube.server.install_crd(_with_default(("rollout", "newField"), "on"))
    path = kube.cluster.path(RLJOBS, NS, "alpha")
    assert (await kube.cluster.request("GET", path))["spec"]["rollout"]["newField"] == "on"
    listed = await kube.cluster.request("GET", kube.cluster.path(RLJOBS, NS))
    assert listed["items"][0]["spec"]["rollout"]["newField"] == "on"
    assert "newField" not in _stored(kube, "alpha")["spec"]["rollout"]
    await kube.cluster.request("PATCH", path, {"metadata": {"labels": {"x": "y"}}})
    stored = _stored(kube, "alpha")
    assert stored["spec"]["rollout"]["newField"] == "on" and stored["metadata"]["generation"] == 1


@pytest.mark.asyncio
async def test_the_generation_moves_with_the_spec_only(kube: Kube) -> None:
    """metadata.generation: incremented on a change of the spec, not of metadata or of status through the
    status subresource (apiextensions-apiserver pkg/registry/customresource/strategy.go, PrepareForUpdate)."""
    await kube.cluster.request("POST", kube.cluster.path(RLJOBS, NS), _job("alpha", {}))
    path = kube.cluster.path(RLJOBS, NS, "alpha")
    await kube.cluster.request("PATCH", path + "/status", {"status": {"phase": "Running"}})
    await kube.cluster.request("PATCH", path, {"metadata": {"annotations": {"a": "b"}}})
    await kube.cluster.request("PATCH", path, {"spec": {"suspend": False}})  # its default: no change
    assert _stored(kube, "alpha")["metadata"]["generation"] == 1
    assert _stored(kube, "alpha")["status"]["phase"] == "Running"
    await kube.cluster.request("PATCH", path, {"spec": {"suspend": True}, "status": {"phase": "ignored"}})
    assert (_stored(kube, "alpha")["metadata"]["generation"], _stored(kube, "alpha")["status"]["phase"]) == (2, "Running")


@pytest.mark.asyncio
async def test_owner_references_with_two_controllers_are_refused(kube: Kube) -> None:
    """apimachinery pkg/api/validation/objectmeta.go, ValidateOwnerReferences."""
    refs = [{"apiVersion": "v1", "kind": "ConfigMap", "name": n, "uid": n, "controller": True} for n in ("a", "b")]
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": NS, "ownerReferences": refs}}
    with pytest.raises(AssertionError, match=r"422.*Only one reference can have Controller set to true"):
        await kube.cluster.request("POST", kube.cluster.path("v1/configmaps", NS), body)


@pytest.mark.asyncio
async def test_garbage_collection_runs_after_the_delete_one_level_a_round_by_owner_identity(kube: Kube) -> None:
    """Background cascading deletion: the owner goes at once, the garbage collector deletes its dependents
    afterwards; an owner reference matches by uid in the dependent's namespace, so a re-created owner of the
    same name adopts nothing (kubernetes.io/docs/concepts/architecture/garbage-collection/,
    kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents/)."""
    created = await kube.cluster.request("POST", kube.cluster.path(RLJOBS, NS), _job("alpha", {}))
    owner = [{"apiVersion": API_VERSION, "kind": KIND, "name": "alpha", "uid": created["metadata"]["uid"],
              "controller": True}]
    await kube.cluster.request("POST", kube.cluster.path(STS, NS), {**_sts("alpha-x", "i:1", replicas=1),
                                                                    "metadata": {"name": "alpha-x", "namespace": NS,
                                                                                 "ownerReferences": owner}})
    await kube.cluster.step()
    assert kube.cluster.pod(NS, "alpha-x-0") is not None
    await kube.cluster.request("DELETE", kube.cluster.path(RLJOBS, NS, "alpha"))
    await kube.cluster.request("POST", kube.cluster.path(RLJOBS, NS), _job("alpha", {}))  # same name, new uid
    assert kube.server.current(STS, NS, "alpha-x") is not None  # not in the DELETE call
    await kube.cluster.step()
    assert kube.server.current(STS, NS, "alpha-x") is None
    assert kube.cluster.pod(NS, "alpha-x-0") is not None  # the next level, the next round
    await kube.cluster.step()
    assert kube.cluster.pod(NS, "alpha-x-0") is None


@pytest.mark.asyncio
async def test_a_statefulset_makes_its_claims_reuses_them_by_name_and_deletes_them_only_by_its_policy(
        kube: Kube) -> None:
    """Claims `<template>-<set>-<ordinal>`, made when missing, never replaced (kubernetes
    pkg/controller/statefulset/stateful_set_utils.go getPersistentVolumeClaimName, stateful_pod_control.go
    createMissingPersistentVolumeClaims); persistentVolumeClaimRetentionPolicy.whenDeleted Delete makes the
    set their owner (updateClaimOwnerRefForSetAndPod), Retain keeps them."""
    await kube.cluster.request("POST", kube.cluster.path(STS, NS), _sts("kept", "i:1"))
    await kube.cluster.step()
    claim = kube.server.current(PVCS, NS, "data-kept-1")
    pod = kube.cluster.pod(NS, "kept-1")
    assert claim is not None and pod is not None
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "data-kept-1"}} in pod["spec"]["volumes"]
    await kube.cluster.request("DELETE", kube.cluster.path(STS, NS, "kept"))
    for _ in range(3):
        await kube.cluster.step()
    assert kube.cluster.pod(NS, "kept-1") is None
    await kube.cluster.request("POST", kube.cluster.path(STS, NS), _sts("kept", "i:1"))
    await kube.cluster.step()
    again = kube.server.current(PVCS, NS, "data-kept-1")
    assert again is not None and again["metadata"]["uid"] == claim["metadata"]["uid"]  # the old data, reused
    await kube.cluster.request("POST", kube.cluster.path(STS, NS), _sts("gone", "i:1", policy="Delete"))
    await kube.cluster.step()
    assert kube.server.current(PVCS, NS, "data-gone-0") is not None
    await kube.cluster.request("DELETE", kube.cluster.path(STS, NS, "gone"))
    await kube.cluster.step()
    assert kube.server.current(PVCS, NS, "data-gone-0") is None


@pytest.mark.asyncio
async def test_a_new_template_replaces_pods_one_at_a_time_from_the_highest_ordinal(kube: Kube) -> None:
    """RollingUpdate: the controller deletes the highest-ordinal pod not at the update revision once the
    others are Ready (kubernetes pkg/controller/statefulset/stateful_set_control.go, updateStatefulSet)."""
    await kube.cluster.request("POST", kube.cluster.path(STS, NS), _sts("web", "i:1", replicas=3))
    await kube.cluster.step()
    uids = {n: (kube.cluster.pod(NS, n) or {})["metadata"]["uid"] for n in ("web-0", "web-1", "web-2")}
    template = copy.deepcopy(_sts("web", "i:2")["spec"]["template"])
    await kube.cluster.request("PATCH", kube.cluster.path(STS, NS, "web"), {"spec": {"template": template}})
    await kube.cluster.step()
    assert kube.cluster.pod(NS, "web-2") is None and kube.cluster.pod(NS, "web-1") is not None
    for _ in range(6):
        await kube.cluster.step()
    pods = [kube.cluster.pod(NS, n) or {} for n in uids]
    assert [p["spec"]["containers"][0]["image"] for p in pods] == ["i:2"] * 3
    assert all(p["metadata"]["uid"] != uids[p["metadata"]["name"]] for p in pods)
    assert len({p["metadata"]["labels"][REVISION] for p in pods}) == 1


def _pod(name: str, requests: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "i:1", "resources": {"requests": requests or {"cpu": "1", "memory": "1Gi"}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"containers": [container], **spec}}


def _quota(name: str, hard: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": NS},
            "spec": {"hard": hard}}


@pytest.mark.asyncio
async def test_a_pod_past_a_quota_is_refused_with_the_quota_admissions_message(kube: Kube) -> None:
    """apiserver plugin/pkg/admission/resourcequota/controller.go (CheckRequest: "exceeded quota: %s, requested:
    %s, used: %s, limited: %s", only the exceeded resources, key=quantity sorted); usage as
    pkg/quota/v1/evaluator/core/pods.go counts it (requests summed over containers, terminal pods not counted);
    a container without a request the quota tracks is refused (enforcePodContainerConstraints)."""
    await kube.cluster.request("POST", kube.cluster.path(QUOTAS, NS), _quota("compute", {
        "requests.cpu": "2500m", "requests.memory": "2Gi", "requests.nvidia.com/gpu": "1", "pods": "5"}))
    await kube.cluster.request("POST", kube.cluster.path(PODS, NS), _pod("a", {"cpu": "1500m", "memory": "1Gi"}))
    code, body = await kube.cluster.attempt("POST", kube.cluster.path(PODS, NS),
                                            _pod("b", {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "2"}))
    assert code == 403 and body["reason"] == "Forbidden"
    assert body["message"] == ('pods "b" is forbidden: exceeded quota: compute, requested: requests.memory=2Gi,'
                               "requests.nvidia.com/gpu=2, used: requests.memory=1Gi,requests.nvidia.com/gpu=0, "
                               "limited: requests.memory=2Gi,requests.nvidia.com/gpu=1")
    code, body = await kube.cluster.attempt("POST", kube.cluster.path(PODS, NS), _pod("c", {"memory": "1Gi"}))
    assert (code, body["message"]) == (403, 'pods "c" is forbidden: failed quota: compute: must specify '
                                            "requests.cpu for: main")
    await kube.cluster.request("PATCH", kube.cluster.path(PODS, NS, "a", "status"), {"status": {"phase": "Succeeded"}})
    await kube.cluster.request("POST", kube.cluster.path(PODS, NS), _pod("d", {"cpu": "2500m", "memory": "2Gi"}))


@pytest.mark.asyncio
async def test_pod_security_restricted_refuses_each_broken_rule_only_where_the_namespace_enforces_it(kube: Kube) -> None:
    """k8s.io/pod-security-admission: admission/admission.go ('violates PodSecurity "restricted:latest": ...',
    403) and policy/check_*.go (each check's reason and detail, in the order of the checks' ids)."""
    loose = _pod("loose", hostNetwork=True, volumes=[{"name": "host", "hostPath": {"path": "/"}}])
    loose["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["SYS_ADMIN"]}}
    await kube.cluster.request("POST", kube.cluster.path(PODS, NS), loose)  # team-a enforces nothing yet
    kube.server.label_namespace(NS, {ENFORCE_LABEL: "restricted"})
    code, body = await kube.cluster.attempt("POST", kube.cluster.path(PODS, NS), {**loose, "metadata": {
        "name": "loose-2", "namespace": NS}})
    assert code == 403
    assert body["message"] == (
        'pods "loose-2" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
        '(container "main" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities '
        '(container "main" must set securityContext.capabilities.drop=["ALL"]; container "main" must not include '
        '"SYS_ADMIN" in securityContext.capabilities.add), host namespaces (hostNetwork=true), hostPath volumes '
        '(volume "host"), restricted volume types (volume "host" uses restricted volume type "hostPath"), '
        'runAsNonRoot != true (pod or container "main" must set securityContext.runAsNonRoot=true), seccompProfile '
        '(pod or container "main" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")')
    tight = _pod("tight", securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                 volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}])
    tight["spec"]["containers"][0]["securityContext"] = {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}
    await kube.cluster.request("POST", kube.cluster.path(PODS, NS), tight)


@pytest.mark.asyncio
async def test_a_validating_webhooks_denial_carries_its_name_and_message(kube: Kube) -> None:
    """apiserver pkg/admission/plugin/webhook/errors/statuserror.go, ToStatusErr."""
    kube.server.register_webhook("deny.example.com", lambda pod: (403, "no") if pod["metadata"]["name"] == "x" else None)
    code, body = await kube.cluster.attempt("POST", kube.cluster.path(PODS, NS), _pod("x"))
    assert (code, body["message"]) == (403, 'admission webhook "deny.example.com" denied the request: no')
    await kube.cluster.request("POST", kube.cluster.path(PODS, NS), _pod("y"))


@pytest.mark.asyncio
async def test_a_refused_pod_create_is_a_failed_create_event_on_the_set_and_is_tried_again(kube: Kube) -> None:
    """pkg/controller/statefulset/stateful_pod_control.go (CreateStatefulPod, recordPodEvent): a Warning
    FailedCreate "create Pod %s in StatefulSet %s failed error: %s"; the set is synced again later."""
    await kube.cluster.request("POST", kube.cluster.path(QUOTAS, NS), _quota("one", {"pods": "1"}))
    await kube.cluster.request("POST", kube.cluster.path(STS, NS), _sts("web", "i:1", replicas=2))
    await kube.cluster.step()
    assert kube.cluster.pod(NS, "web-0") is not None and kube.cluster.pod(NS, "web-1") is None
    events = [e for e in kube.server.live("events", NS) if e["involvedObject"]["name"] == "web"]
    assert [(e["type"], e["reason"], e["message"]) for e in events] == [(
        "Warning", "FailedCreate", 'create Pod web-1 in StatefulSet web failed error: pods "web-1" is forbidden: '
        "exceeded quota: one, requested: pods=1, used: pods=1, limited: pods=1")]
    assert await kube.cluster.step() == 0  # the same refusal again: no new event, the cluster settles
    await kube.cluster.request("PATCH", kube.cluster.path(QUOTAS, NS, "one"), {"spec": {"hard": {"pods": "2"}}})
    await kube.cluster.step()
    assert kube.cluster.pod(NS, "web-1") is not None


@pytest.mark.asyncio
async def test_a_set_waits_for_a_pod_of_its_name_that_is_not_its_own_to_go(kube: Kube) -> None:
    """CreateStatefulPod sinks AlreadyExists (no event) and the set is synced again: the pod is made once the
    other one is gone."""
    await kube.cluster.request("POST", kube.cluster.path(PODS, NS), _pod("web-0"))
    await kube.cluster.request("POST", kube.cluster.path(STS, NS), _sts("web", "i:1", replicas=1))
    await kube.cluster.step()
    assert (kube.cluster.pod(NS, "web-0") or {})["spec"]["containers"][0]["resources"]  # still the other one
    assert not kube.server.live("events", NS)
    await kube.cluster.request("DELETE", kube.cluster.path(PODS, NS, "web-0"))
    await kube.cluster.step()
    assert (kube.cluster.pod(NS, "web-0") or {})["metadata"]["ownerReferences"][0]["name"] == "web"


@pytest.mark.asyncio
async def test_kueues_pod_webhook_labels_and_gates_the_pods_it_manages_and_a_skipped_pod_has_neither(
        kube: Kube) -> None:
    """kubernetes-sigs/kueue pkg/controller/jobs/pod/pod_webhook.go (Default): `kueue.x-k8s.io/managed=true`
    and the `kueue.x-k8s.io/admission` scheduling gate on every pod it manages."""
    queued = _sts("q", "i:1", replicas=1)
    queued["spec"]["template"]["metadata"]["labels"][KUEUE_GROUP_LABEL] = "q"
    await kube.cluster.request("POST", kube.cluster.path(STS, NS), queued)
    await kube.cluster.step()
    pod = kube.cluster.pod(NS, "q-0") or {}
    assert pod["metadata"]["labels"][KUEUE_MANAGED] == "true" and pod["spec"]["schedulingGates"] == [{"name": KUEUE_GATE}]
    kube.cluster.kueue_webhook = False
    await kube.cluster.request("POST", kube.cluster.path(STS, NS), {**queued, "metadata": {"name": "s", "namespace": NS}})
    await kube.cluster.step()
    skipped = kube.cluster.pod(NS, "s-0") or {}
    assert KUEUE_MANAGED not in skipped["metadata"]["labels"] and not skipped["spec"].get("schedulingGates")
