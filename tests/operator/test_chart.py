"""charts/rhymerl: lint, what it renders with default and full values, least privilege, pod security."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_runner import CHART, FULL_VALUES, NAMESPACE, VARIANTS, run_helm

from rhymerl.api.crd import crd, crd_helm_template
from rhymerl.api.spec import RLJob
from rhymerl.operator.manifests import RESOURCES, Owner, desired

Objects = dict[str, list[dict[str, Any]]]


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def _kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


@pytest.mark.parametrize("values", [None, FULL_VALUES], ids=["default", "full"])
def test_helm_lint_strict_passes(helm: Path, values: Path | None) -> None:
    res = run_helm(helm, "lint", "--strict", str(CHART), *(["-f", str(values)] if values else []))
    assert res.returncode == 0, res.stdout + res.stderr


def test_values_outside_the_schema_are_refused(helm: Path) -> None:
    res = run_helm(helm, "template", "x", str(CHART), "--set", "operator.replicas=3")
    assert res.returncode != 0 and "replicas" in res.stderr


def test_default_values_render_the_operator_its_rbac_the_crd_and_a_metrics_service(chart: Objects) -> None:
    assert _kinds(chart["default"]) == ["ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                                        "Deployment", "Service", "ServiceAccount"]
    assert _kinds(chart["full"]) == ["CustomResourceDefinition", "Deployment", "Deployment", "Role", "RoleBinding",
                                     "Secret", "Service", "Service", "ServiceAccount", "ServiceMonitor"]


def test_the_committed_crd_template_is_the_generator_output() -> None:
    committed = (CHART / "templates" / "crd.yaml").read_text()
    assert committed == crd_helm_template(), "run `rhymerl crd --helm > charts/rhymerl/templates/crd.yaml`"


def test_the_chart_installs_the_same_crd_as_rhymerl_crd(chart: Objects) -> None:
    generated = crd()
    for variant in ("default", "full"):
        installed = _one(chart[variant], "CustomResourceDefinition")
        assert installed["spec"] == generated["spec"]
        assert installed["metadata"]["name"] == generated["metadata"]["name"]
    assert _one(chart["default"], "CustomResourceDefinition")["metadata"]["annotations"] == {
        "helm.sh/resource-policy": "keep"}
    assert "annotations" not in _one(chart["full"], "CustomResourceDefinition")["metadata"]


def test_crds_enabled_false_leaves_the_crd_out(helm: Path) -> None:
    res = run_helm(helm, "template", "x", str(CHART), "--set", "crds.enabled=false")
    assert res.returncode == 0, res.stderr
    assert "CustomResourceDefinition" not in [d["kind"] for d in yaml.safe_load_all(res.stdout) if d]


def test_the_operator_is_one_replica_replaced_with_recreate(chart: Objects) -> None:
    for variant in VARIANTS:
        operator = next(d for d in chart[variant] if d["kind"] == "Deployment" and d["metadata"]["labels"][
            "app.kubernetes.io/component"] == "operator")
        assert operator["spec"]["replicas"] == 1
        assert operator["spec"]["strategy"] == {"type": "Recreate"}


def test_watching_one_namespace_passes_it_to_the_operator_and_grants_a_role_there_only(chart: Objects) -> None:
    full = chart["full"]
    container = _one([d for d in full if d["metadata"]["name"] == "rl-operator"], "Deployment")[
        "spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:3] == ["operator", "--namespace", "rl"]
    assert _one(full, "Role")["metadata"]["namespace"] == "rl"
    assert _one(full, "RoleBinding")["subjects"] == [{"kind": "ServiceAccount", "name": "rhymerl-operator",
                                                      "namespace": NAMESPACE}]
    assert not {"ClusterRole", "ClusterRoleBinding"} & set(_kinds(full))
    default_args = _one(chart["default"], "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace" not in default_args


def test_reading_nodes_is_on_cluster_wide_off_in_one_namespace_and_there_one_clusterrole_of_its_own(
        helm: Path) -> None:
    def render(*sets: str) -> list[dict[str, Any]]:
        res = run_helm(helm, "template", "x", str(CHART), "--namespace", NAMESPACE,
                       *(arg for s in sets for arg in ("--set", s)))
        assert res.returncode == 0, res.stderr
        return [d for d in yaml.safe_load_all(res.stdout) if d]

    assert "nodes" not in {g[1] for g in _grants(_one(render("operator.readNodes=false"), "ClusterRole")["rules"])}
    one_namespace = render("operator.watchNamespace=rl", "operator.readNodes=true")
    nodes = _one(one_namespace, "ClusterRole")
    assert nodes["metadata"]["name"] == f"x-rhymerl-{NAMESPACE}-nodes"
    assert _grants(nodes["rules"]) == {("", "nodes", v) for v in ("get", "list", "watch")}
    assert _one(one_namespace, "ClusterRoleBinding")["roleRef"]["name"] == f"x-rhymerl-{NAMESPACE}-nodes"


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for r in rules for group in r["apiGroups"] for resource in r["resources"]
            for verb in r["verbs"]}


def test_the_operator_may_manage_every_kind_it_creates_and_nothing_broader(chart: Objects) -> None:
    grants = _grants(_one(chart["default"], "ClusterRole")["rules"])
    job = RLJob.model_validate({"metadata": {"name": "j"}, "spec": {"rollout": {"max_replicas": 2}}})
    for obj in desired(job, Owner("rhymerl.io/v1alpha1", "RLJob", "j", "uid")):
        group, resource = RESOURCES[obj["kind"]]
        for verb in ("get", "list", "watch", "create", "patch", "delete"):
            assert (group, resource, verb) in grants, (obj["kind"], verb)
    # granting the per-job Role needs these very permissions (Kubernetes refuses escalation)
    assert {("rhymerl.io", "rljobs", "get"), ("rhymerl.io", "rljobs/status", "get"),
            ("rhymerl.io", "rljobs/status", "patch"), ("", "pods", "watch"), ("", "events", "create")} <= grants
    assert all("*" not in grant for grant in grants)
    assert not {g for g in grants if g[1] in {"clusterroles", "clusterrolebindings"}}
    # nodes read only, for their taints (a pod gone from a node that goes is a preemption)
    assert {g for g in grants if g[1] == "nodes"} == {("", "nodes", v) for v in ("get", "list", "watch")}
    # each job's Ray token: created, never read, listed, watched or changed
    assert {g for g in grants if g[1] == "secrets"} == {("", "secrets", "create")}
    assert not {g for g in grants if g[1] == "pods" and g[2] not in {"get", "list", "watch"}}


def _pod_specs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o["spec"]["template"]["spec"] for o in objects if o["kind"] in {"Deployment", "StatefulSet"}]


def test_every_pod_runs_non_root_read_only_with_no_capabilities_and_runtime_default_seccomp(chart: Objects) -> None:
    job = RLJob.model_validate({"metadata": {"name": "j"}})
    pods = [p for v in VARIANTS for p in _pod_specs(chart[v])] + _pod_specs(desired(job, None))
    assert len(pods) > 8
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]


def test_redis_takes_its_password_from_the_chart_secret_or_an_existing_one(chart: Objects) -> None:
    full = chart["full"]
    secret = _one(full, "Secret")
    assert secret["metadata"]["name"] == "rl-operator-redis" and "redis-password" in secret["data"]
    redis = next(d for d in full if d["kind"] == "Deployment" and d["metadata"]["name"] == "rl-operator-redis")
    env = redis["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "rl-operator-redis",
                                                                              "key": "redis-password"}}}]
    existing = chart["existing-secret"]
    assert "Secret" not in _kinds(existing)
    refs = [e["valueFrom"]["secretKeyRef"] for d in existing if d["kind"] == "Deployment"
            for e in d["spec"]["template"]["spec"]["containers"][0]["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert refs == [{"name": "team-redis", "key": "password"}] * 2  # the operator and redis


def test_the_operator_gets_the_password_of_a_redis_outside_the_chart_from_a_secret_named_in_its_values(
        chart: Objects) -> None:
    operator = _one(chart["external-redis"], "Deployment")
    env = {e["name"]: e.get("valueFrom") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RHYMERL_REDIS_PASSWORD"] == {"secretKeyRef": {"name": "ext-redis", "key": "pw"}}
    values = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert values["RHYMERL_REDIS_ENDPOINTS"] == "redis.data.svc.cluster.local:6379"  # the Redis it is for, alone
    ours = next(d for d in chart["full"] if d["kind"] == "Deployment" and "redis" not in d["metadata"]["name"])
    values = {e["name"]: e.get("value") for e in ours["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert values["RHYMERL_REDIS_ENDPOINTS"] == f"rl-operator-redis.{NAMESPACE}.svc.cluster.local:6379"
    default = _one([d for d in chart["default"] if d["kind"] == "Deployment"], "Deployment")
    assert "RHYMERL_REDIS_PASSWORD" not in {e["name"] for e in default["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_the_service_monitor_scrapes_the_metrics_service_port(chart: Objects) -> None:
    full = chart["full"]
    monitor = _one(full, "ServiceMonitor")
    service = next(s for s in full if s["kind"] == "Service" and s["metadata"]["name"] == "rl-operator-metrics")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    operator = next(d for d in full if d["kind"] == "Deployment" and d["metadata"]["name"] == "rl-operator")
    assert service["spec"]["selector"].items() <= operator["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"] for p in operator["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in ports


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's merge of a values file over values.yaml: maps merge, everything else is replaced."""
    out = dict(base)
    for key, value in override.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def test_the_values_schema_is_valid_json_schema_and_allows_the_default_and_full_values() -> None:
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(defaults, schema)
    jsonschema.validate(_merged(defaults, yaml.safe_load(FULL_VALUES.read_text())), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_merged(defaults, {"redis": {"enabeld": True}}), schema)


def _render(helm: Path, release: str, namespace: str, *sets: str) -> list[dict[str, Any]]:
    res = run_helm(helm, "template", release, str(CHART), "--namespace", namespace,
                   *(arg for s in sets for arg in ("--set", s)))
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


CLUSTER_SCOPED = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Namespace"}


def _cluster_scoped(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in CLUSTER_SCOPED}


def test_a_second_release_in_another_namespace_claims_no_cluster_scoped_object_of_the_first(helm: Path) -> None:
    first = _render(helm, "rhymerl", "team-a", "operator.watchNamespace={team-a,team-a-jobs}")
    second = _render(helm, "rhymerl", "team-b", "crds.enabled=false", "operator.watchNamespace={team-b}",
                     "operator.readNodes=true")
    assert ("CustomResourceDefinition", "rljobs.rhymerl.io") in _cluster_scoped(first)
    assert not _cluster_scoped(first) & _cluster_scoped(second), "one owner per cluster-scoped object"
    args = {o["metadata"]["namespace"]: o["spec"]["template"]["spec"]["containers"][0]["args"]
            for o in first + second if o["kind"] == "Deployment"}
    assert args["team-a"][:5] == ["operator", "--namespace", "team-a", "--namespace", "team-a-jobs"]
    assert args["team-b"][:3] == ["operator", "--namespace", "team-b"] and args["team-b"].count("--namespace") == 1
    roles = {(o["metadata"]["namespace"], o["subjects"][0]["namespace"]) for o in first + second
             if o["kind"] == "RoleBinding"}
    assert roles == {("team-a", "team-a"), ("team-a-jobs", "team-a"), ("team-b", "team-b")}


def test_two_cluster_wide_releases_of_one_name_in_two_namespaces_get_distinct_cluster_roles(helm: Path) -> None:
    a, b = (_render(helm, "rhymerl", namespace, "crds.enabled=false") for namespace in ("team-a", "team-b"))
    assert _cluster_scoped(a) == {("ClusterRole", "rhymerl-team-a"), ("ClusterRoleBinding", "rhymerl-team-a")}
    assert not _cluster_scoped(a) & _cluster_scoped(b)
    binding = _one(b, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "rhymerl-team-b" and binding["subjects"][0]["namespace"] == "team-b"
