"""The pure builders: what the operator would create for an RLJob, checked without an API server."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
from jobs import make_job

from rhymerl.api import RLJob, dump_job, load_job, parse_job
from rhymerl.api.history_keys import REDIS_PASSWORD_ENV
from rhymerl.api.placement import GPU_RESOURCE
from rhymerl.api.rollout import RolloutSpec
from rhymerl.operator.manifests import (
    ROLES,
    SPEC_HASH_ANNOTATION,
    Owner,
    desired,
    labels,
    replicas,
    rollout_replicas,
    selector,
    selector_string,
    spec_hash,
)
from rhymerl.operator.manifests.roles import argv, environment
from rhymerl.operator.manifests.spec_config import localized, spec_yaml

REPO = Path(__file__).resolve().parents[2]
OWNER = Owner("rhymerl.io/v1alpha1", "RLJob", "math-grpo", "6a3c1f0e-0000-4000-8000-000000000001")


_job = partial(make_job, {"metadata": {"name": "math-grpo", "namespace": "rl"}}, base="defaults")


def _cluster() -> RLJob:
    return load_job(REPO / "examples" / "cluster.yaml")


def _by(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def _pod(objects: list[dict[str, Any]], role: str) -> dict[str, Any]:
    sts = _by(objects, "StatefulSet")[f"math-grpo-{role}"]
    pod: dict[str, Any] = sts["spec"]["template"]["spec"]
    return pod


def test_children_come_in_a_fixed_order_with_names_derived_from_the_job() -> None:
    kinds_and_names = [(o["kind"], o["metadata"]["name"]) for o in desired(_cluster(), OWNER)]
    assert kinds_and_names == [
        ("ConfigMap", "math-grpo-spec"),
        ("ServiceAccount", "math-grpo-controller"), ("Role", "math-grpo-controller"),
        ("RoleBinding", "math-grpo-controller"),
        *[("Service", f"math-grpo-{r}") for r in ROLES],
        *[("StatefulSet", f"math-grpo-{r}") for r in ROLES],
        ("PodDisruptionBudget", "math-grpo-rollout"), ("PodDisruptionBudget", "math-grpo-history"),
        ("NetworkPolicy", "math-grpo-pods"), ("NetworkPolicy", "math-grpo-dist"),
    ]


def test_the_same_job_read_twice_renders_to_equal_objects() -> None:
    job = _cluster()
    again = parse_job(dump_job(job))
    assert desired(job, OWNER) == desired(again, OWNER)


def test_every_child_is_owned_by_the_job_and_lives_in_its_namespace() -> None:
    for obj in desired(_cluster(), OWNER):
        assert obj["metadata"]["namespace"] == "rl"
        assert obj["metadata"]["ownerReferences"] == [{
            "apiVersion": "rhymerl.io/v1alpha1", "kind": "RLJob", "name": "math-grpo", "uid": OWNER.uid,
            "controller": True, "blockOwnerDeletion": True}]


def test_without_an_owner_there_are_no_owner_references_and_a_job_without_namespace_goes_to_default() -> None:
    job = RLJob.model_validate({"metadata": {"name": "plain"}})
    for obj in desired(job, None):
        assert "ownerReferences" not in obj["metadata"]
        assert obj["metadata"]["namespace"] == "default"


def test_every_child_carries_the_app_kubernetes_io_labels_and_each_role_selects_only_its_pods() -> None:
    objects = desired(_cluster(), OWNER)
    for obj in objects:
        meta = obj["metadata"]
        role = meta["labels"].get("app.kubernetes.io/component")
        assert meta["labels"] == labels("math-grpo", role)
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "rhymerl-operator"
    for role in ROLES:
        sts = _by(objects, "StatefulSet")[f"math-grpo-{role}"]
        pod_labels = sts["spec"]["template"]["metadata"]["labels"]
        assert sts["spec"]["selector"]["matchLabels"] == selector("math-grpo", role)
        assert selector("math-grpo", role).items() <= pod_labels.items()
        others = [r for r in ROLES if r != role]
        assert all(not selector("math-grpo", r).items() <= pod_labels.items() for r in others)
        assert _by(objects, "Service")[f"math-grpo-{role}"]["spec"]["selector"] == selector("math-grpo", role)
    assert selector_string("math-grpo", "rollout") == ("app.kubernetes.io/name=rhymerl,app.kubernetes.io/instance="
                                                       "math-grpo,app.kubernetes.io/component=rollout")


def test_gpu_requests_come_from_each_roles_resources_gpu() -> None:
    objects = desired(_cluster(), OWNER)  # rollout: 1 GPU, train: 8, the rest none
    for role, gpus in {"rollout": "1", "train": "8"}.items():
        resources = _pod(objects, role)["containers"][0]["resources"]
        assert resources["requests"][GPU_RESOURCE] == gpus and resources["limits"][GPU_RESOURCE] == gpus
    for role in ("controller", "reward", "history"):
        resources = _pod(objects, role)["containers"][0]["resources"]
        assert GPU_RESOURCE not in resources["requests"] and GPU_RESOURCE not in resources["limits"]
    assert _pod(objects, "train")["containers"][0]["resources"]["requests"]["memory"] == "256Gi"


def test_spot_tolerations_and_a_preferred_affinity_reach_rollout_pods_only() -> None:
    spot = {"enabled": True, "node_selector": {"cloud.google.com/gke-spot": "true"},
            "tolerations": [{"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
                             "effect": "NoSchedule"}]}
    objects = desired(_job({"rollout": {"spot": spot}}), OWNER)
    rollout = _pod(objects, "rollout")
    assert rollout["tolerations"] == [{"operator": "Equal", "key": "cloud.google.com/gke-spot", "value": "true",
                                       "effect": "NoSchedule"}]
    preferred = rollout["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [{"weight": 100, "preference": {"matchExpressions": [
        {"key": "cloud.google.com/gke-spot", "operator": "In", "values": ["true"]}]}}]
    for role in ("controller", "train", "reward", "history"):
        pod = _pod(objects, role)
        assert "tolerations" not in pod and "affinity" not in pod


def test_required_spot_makes_the_affinity_a_requirement_and_disabled_spot_adds_nothing() -> None:
    spot = {"enabled": True, "required": True, "node_selector": {"eks.amazonaws.com/capacityType": "SPOT"}}
    rollout = _pod(desired(_job({"rollout": {"spot": spot}}), OWNER), "rollout")
    terms = rollout["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["SPOT"]
    off = _pod(desired(_job({"rollout": {"spot": {**spot, "enabled": False}}}), OWNER), "rollout")
    assert "affinity" not in off and "tolerations" not in off


def test_node_selector_tolerations_and_topology_spread_come_from_each_roles_block() -> None:
    train = {"node_selector": {"pool": "a100"}, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
             "topology_spread": {"max_skew": 2, "topology_key": "topology.kubernetes.io/zone",
                                 "when_unsatisfiable": "DoNotSchedule"}}
    objects = desired(_job({"train": train, "history": {"topology_spread": {"enabled": False}}}), OWNER)
    pod = _pod(objects, "train")
    assert pod["nodeSelector"] == {"pool": "a100"}
    assert pod["tolerations"] == [{"operator": "Exists", "key": "nvidia.com/gpu"}]
    assert pod["topologySpreadConstraints"] == [{
        "maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": selector("math-grpo", "train")}}]
    assert "nodeSelector" not in _pod(objects, "rollout")
    assert "topologySpreadConstraints" not in _pod(objects, "history")
    assert _pod(objects, "rollout")["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"


def test_suspend_scales_every_stateful_set_to_zero() -> None:
    running = _cluster()
    suspended = running.model_copy(update={"spec": running.spec.model_copy(update={"suspend": True})})
    assert {r: s["spec"]["replicas"] for r, s in _by(desired(running, OWNER), "StatefulSet").items()} == {
        "math-grpo-controller": 1, "math-grpo-rollout": 8, "math-grpo-train": 2, "math-grpo-reward": 1,
        "math-grpo-history": 2}
    assert all(s["spec"]["replicas"] == 0 for s in _by(desired(suspended, OWNER), "StatefulSet").values())
    assert all(replicas(suspended, role) == 0 for role in ROLES)


def test_rollout_replicas_are_clamped_to_min_and_max_replicas() -> None:
    # The spec refuses these (so does the CRD); model_construct builds what might still slip past both.
    assert rollout_replicas(RolloutSpec.model_construct(replicas=50, min_replicas=2, max_replicas=16)) == 16
    assert rollout_replicas(RolloutSpec.model_construct(replicas=1, min_replicas=4, max_replicas=16)) == 4
    assert rollout_replicas(RolloutSpec(replicas=8, min_replicas=4, max_replicas=16)) == 8


def test_reward_pods_run_only_for_a_reward_function() -> None:
    assert replicas(_job({"reward": {"replicas": 3}}), "reward") == 0
    assert replicas(_job({"reward": {"replicas": 3, "function": "my_rewards:score"}}), "reward") == 3


def test_the_spec_hash_changes_with_the_spec_and_not_with_scaling_suspend_or_how_the_yaml_was_written() -> None:
    scaled = {"rollout": {"replicas": 2, "max_replicas": 4}}
    base = _job(scaled)
    same = parse_job("apiVersion: rhymerl.io/v1alpha1\nkind: RLJob\nmetadata: {namespace: rl, name: math-grpo}\n"
                     "spec:\n  rollout: {max_replicas: 4, replicas: 2}\n  algorithm: {name: grpo}\n")
    assert spec_hash(same) == spec_hash(base)
    for change in ("rollout.replicas=3", "suspend=true", "failure_policy.backoff_limit=9"):
        assert spec_hash(_job(scaled, change)) == spec_hash(base), change
    for change in ("algorithm.lr=0.0003", "rollout.temperature=0.7"):
        assert spec_hash(_job(scaled, change)) != spec_hash(base), change
    templates = [s["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
                 for s in _by(desired(base, OWNER), "StatefulSet").values()]
    assert templates == [spec_hash(base)] * len(ROLES)


def test_the_controller_may_read_its_own_rljob_and_patch_its_status_and_nothing_else() -> None:
    objects = desired(_cluster(), OWNER)
    role = _by(objects, "Role")["math-grpo-controller"]
    assert role["rules"] == [
        {"apiGroups": ["rhymerl.io"], "resources": ["rljobs"], "resourceNames": ["math-grpo"], "verbs": ["get"]},
        {"apiGroups": ["rhymerl.io"], "resources": ["rljobs/status"], "resourceNames": ["math-grpo"],
         "verbs": ["get", "patch"]},
    ]
    binding = _by(objects, "RoleBinding")["math-grpo-controller"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "math-grpo-controller"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "math-grpo-controller", "namespace": "rl"}]
    controller = _pod(objects, "controller")
    assert controller["serviceAccountName"] == "math-grpo-controller"
    assert controller["automountServiceAccountToken"] is True
    for other in ("rollout", "train", "reward", "history"):
        pod = _pod(objects, other)
        assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod


def test_the_config_map_holds_a_spec_that_parses_back_to_the_same_job() -> None:
    for example in sorted((REPO / "examples").glob("*.yaml")):
        job = load_job(example)
        config = desired(job, OWNER)[0]
        assert config["kind"] == "ConfigMap"
        assert parse_job(config["data"]["spec.yaml"]) == localized(job)  # fetched sources: where they land


def test_pods_run_the_roles_command_and_environment_and_mount_the_spec() -> None:
    objects = desired(_cluster(), OWNER)
    for role in ROLES:
        container = _pod(objects, role)["containers"][0]
        assert [*container["command"], *container["args"]] == argv(role)
        values = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        user = {e.name: e.value for e in getattr(_cluster().spec, role).pod.env}  # the example's PYTHONPATH
        assert values.pop("RHYMERL_OBJECT_STORE_BYTES").isdigit()  # sized from the role's memory (below)
        assert values.pop("RHYMERL_JOB_UID") == OWNER.uid  # its run folders record it (run_folder/identity.py)
        assert values == {**environment("math-grpo", role), **user}
        assert {"name": "spec", "mountPath": "/etc/rhymerl", "readOnly": True} in container["volumeMounts"]
    assert _pod(objects, "rollout")["containers"][0]["image"] == "ghcr.io/rhymerl/worker-gpu:0.1.0"
    assert _pod(objects, "controller")["containers"][0]["image"] == "ghcr.io/rhymerl/worker-cpu:0.1.0"


def test_pods_run_as_non_root_on_a_read_only_root_without_capabilities() -> None:
    for role in ROLES:
        pod = _pod(desired(_cluster(), OWNER), role)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        context = pod["containers"][0]["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}


def test_checkpoints_live_on_volume_claims_of_the_controller_and_train_pods_only() -> None:
    job = _job({"checkpoint": {"storage": {"size": "100Gi", "storage_class": "fast",
                                           "keep_on_delete": False}}})
    sets = _by(desired(job, OWNER), "StatefulSet")
    for role in ("controller", "train"):
        spec = sets[f"math-grpo-{role}"]["spec"]
        claim = spec["volumeClaimTemplates"][0]
        assert claim["metadata"]["name"] == "data"
        assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"
        assert claim["spec"]["storageClassName"] == "fast"
        assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    for role in ("rollout", "reward", "history"):
        assert "volumeClaimTemplates" not in sets[f"math-grpo-{role}"]["spec"]


def test_an_evicted_controller_has_time_to_finish_its_step_and_a_rollout_pod_to_hand_its_samples_back() -> None:
    objects = desired(_cluster(), OWNER)
    grace = {role: _pod(objects, role)["terminationGracePeriodSeconds"]
             for role in ("controller", "rollout", "train", "reward", "history")}
    assert grace == {"controller": 900, "rollout": 60, "train": 30, "reward": 30, "history": 30}
    for role, seconds in grace.items():  # each pod knows its own grace period
        env = {e["name"]: e.get("value") for e in _pod(objects, role)["containers"][0]["env"]}
        assert env["RHYMERL_GRACE_S"] == str(seconds)


def test_disruption_budgets_cover_the_roles_that_can_have_two_pods() -> None:
    small = [o["metadata"]["name"] for o in desired(_job(), OWNER) if o["kind"] == "PodDisruptionBudget"]
    assert small == []
    grown = desired(_job("rollout.max_replicas=4", {"reward": {"function": "m:f", "replicas": 2}}), OWNER)
    budgets = _by(grown, "PodDisruptionBudget")
    assert list(budgets) == ["math-grpo-rollout", "math-grpo-reward"]
    assert budgets["math-grpo-rollout"]["spec"]["maxUnavailable"] == 1
    assert budgets["math-grpo-rollout"]["spec"]["selector"]["matchLabels"] == selector("math-grpo", "rollout")


def test_node_autoscalers_may_not_consolidate_away_the_controller_and_train_pods_but_may_move_the_rest() -> None:
    objects = desired(_job({"train": {"replicas": 2}}), OWNER)
    kept = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false", "karpenter.sh/do-not-disrupt": "true"}
    for role in ROLES:
        annotations = _by(objects, "StatefulSet")[f"math-grpo-{role}"]["spec"]["template"]["metadata"]["annotations"]
        assert ({k: annotations.get(k) for k in kept} == kept) is (role in ("controller", "train")), role
    # a drain or an upgrade still may: no budget forbids evicting them
    assert not {"math-grpo-controller", "math-grpo-train"} & set(_by(objects, "PodDisruptionBudget"))
    # the user's own annotation wins (e.g. a team that lets the autoscaler move its train pods)
    mine = desired(_job({"train": {"pod": {"annotations": {"karpenter.sh/do-not-disrupt": "false"}}}}), OWNER)
    template = _by(mine, "StatefulSet")["math-grpo-train"]["spec"]["template"]["metadata"]["annotations"]
    assert template["karpenter.sh/do-not-disrupt"] == "false"


def test_the_redis_password_reaches_history_clients_from_the_named_secret() -> None:
    history = {"store": "redis", "redis_url": "redis://rhymerl-redis:6379/0",
               "redis_password_secret": {"name": "rhymerl-redis", "key": "redis-password"}}
    job = _job({"history": history})
    objects = desired(job, OWNER)
    ref = {"secretKeyRef": {"name": "rhymerl-redis", "key": "redis-password"}}
    for role, gets in {"controller": True, "rollout": True, "history": True, "train": False, "reward": False}.items():
        env = {e["name"]: e for e in _pod(objects, role)["containers"][0]["env"]}
        assert (env.get(REDIS_PASSWORD_ENV, {}).get("valueFrom") == ref) is gets


@pytest.mark.parametrize("name", ["a" * 42, "9lives", "with.dot"])
def test_job_names_that_cannot_name_kubernetes_children_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        RLJob.model_validate({"metadata": {"name": name}})
    longest = RLJob.model_validate({"metadata": {"name": "a" * 41}})
    assert max(len(o["metadata"]["name"]) for o in desired(longest, None)) == 52


def test_a_jobs_spec_yaml_is_rendered_once_and_again_when_the_job_changes() -> None:
    job = RLJob.model_validate({"metadata": {"name": "memo"}, "spec": {"rollout": {"max_replicas": 3}}})
    first = spec_yaml(job)
    assert first == dump_job(localized(job))
    assert spec_yaml(job.model_copy(deep=True)) is first  # an equal job: the string already rendered
    changed = RLJob.model_validate({"metadata": {"name": "memo"}, "spec": {"rollout": {"max_replicas": 4}}})
    assert spec_yaml(changed) == dump_job(localized(changed)) != first


def test_every_pod_is_a_ray_node_whose_object_store_fits_an_in_memory_dev_shm_counted_in_its_limit() -> None:
    """A container's own /dev/shm is 64 MiB: Ray would put its object store on disk under /tmp. Each pod
    mounts a memory-backed /dev/shm and tells its node the store's size (Ray's default 30% of the
    pod's memory, made explicit); on a GPU pod NCCL and vLLM use it too, so it has no size limit there."""
    objects = desired(_job({"rollout": {"resources": {"gpu": 1, "memory": "64Gi"}},
                            "train": {"resources": {"memory": "10Gi"}}}), OWNER)
    for role, store in [("controller", int(2 * 2**30 * 0.3)), ("train", int(10 * 2**30 * 0.3)),
                        ("rollout", int(64 * 2**30 * 0.3))]:
        pod = _pod(objects, role)
        container = next(c for c in pod["containers"] if c["name"] == role)
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["RHYMERL_OBJECT_STORE_BYTES"] == str(store)
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]
        assert shm == ({"medium": "Memory"} if role == "rollout" else
                       {"medium": "Memory", "sizeLimit": str(store + (64 << 20))})


def test_every_role_container_learns_its_cpu_request_for_its_threads_where_it_has_no_cpu_limit() -> None:
    objects = desired(_job(), OWNER)
    for role in ("controller", "rollout", "train", "reward", "history"):
        container = next(c for c in _pod(objects, role)["containers"] if c["name"] == role)
        env = {e["name"]: e.get("valueFrom") for e in container["env"]}
        assert env["RHYMERL_CPU_REQUEST"] == {"resourceFieldRef": {"containerName": role, "resource": "requests.cpu",
                                                                   "divisor": "1"}}
        assert "cpu" not in container["resources"]["limits"]  # no limit: the request is what it may count on
