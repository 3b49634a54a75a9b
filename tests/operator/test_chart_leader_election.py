"""charts/rhymerl with two operator replicas: leader election on, its Lease's RBAC, and no second replica without it."""

from __future__ import annotations

from pathlib import Path

import yaml
from helm_runner import CHART, NAMESPACE, run_helm


def test_two_replicas_elect_a_leader_on_one_lease_they_alone_may_update(helm: Path) -> None:
    res = run_helm(helm, "template", "rhymerl", str(CHART), "--namespace", NAMESPACE,
                   "--set", "operator.replicas=2", "--set", "operator.leaderElection=true")
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    operator = next(d for d in docs if d["kind"] == "Deployment")
    assert operator["spec"]["replicas"] == 2 and operator["spec"]["strategy"] == {"type": "RollingUpdate"}
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RHYMERL_LEADER_ELECTION"] == "true" and "RHYMERL_NAMESPACE" in env
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-leader-election"))
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["rhymerl-operator"],
         "verbs": ["get", "update"]}]
    binding = next(d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == role["metadata"]["name"])
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_two_replicas_without_leader_election_are_refused(helm: Path) -> None:
    res = run_helm(helm, "template", "rhymerl", str(CHART), "--set", "operator.replicas=2")
    assert res.returncode != 0 and "leaderElection" in res.stderr
