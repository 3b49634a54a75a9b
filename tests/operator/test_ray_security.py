"""Ray inside a job, secured: every pod runs Ray with the job's token (a Secret the operator makes),
on fixed ports, and the job's NetworkPolicies let in only the job's own pods on exactly those ports
(plus anyone on the read-only metrics ports, and torch.distributed between rollout and train pods).
The ports the policy names are the ports node.py starts Ray with: one definition (ray_network.py)."""

from __future__ import annotations

import re
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from jobs import make_job

from rhymerl.api.roles import ROLES
from rhymerl.operator.manifests import Owner, desired
from rhymerl.operator.manifests.access import ray_token_name, ray_token_secret
from rhymerl.operator.manifests.roles import HTTP_PORT, RAY_GCS_PORT, environment
from rhymerl.workers.runtime import node
from rhymerl.workers.runtime.ray_network import (
    AUTH_MODE_ENV,
    POD_PORTS,
    TOKEN_DIR,
    TOKEN_KEY,
    TOKEN_PATH,
    TOKEN_PATH_ENV,
    RayPorts,
    auth_env,
)

OWNER = Owner("rhymerl.io/v1alpha1", "RLJob", "a", "uid-a")
Manifest = dict[str, Any]


_job = partial(make_job, {"metadata": {"name": "a", "namespace": "ns"}, "rollout": {"replicas": 2, "max_replicas": 3},
                           "train": {"resources": {"gpu": 0}}}, base="defaults")


def _pod_templates(objects: list[Manifest]) -> list[Manifest]:
    return [o["spec"]["template"] for o in objects if o["kind"] == "StatefulSet"]


def _policies(objects: list[Manifest]) -> dict[str, Manifest]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "NetworkPolicy"}


def _selects(selector: Manifest, pod_labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions with In) against a pod's labels, as Kubernetes reads it."""
    if any(pod_labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In"
        if pod_labels.get(e["key"]) not in e["values"]:
            return False
    return True


def _flag_ports(args: list[str]) -> dict[str, int]:
    return {m[1]: int(m[2]) for a in args if (m := re.fullmatch(r"--([a-z-]*port)=(\d+)", a))}


def test_the_token_secret_is_immutable_owned_by_the_job_and_valid_kubernetes() -> None:
    secret = ray_token_secret(_job(), OWNER, "t0k3n")
    assert secret["metadata"]["name"] == ray_token_name("a") == "a-ray-token"
    assert secret["metadata"]["namespace"] == "ns"
    assert secret["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert secret["immutable"] is True and secret["stringData"] == {TOKEN_KEY: "t0k3n"}
    for version in ("1.29", "1.34"):
        kubernetes_validate.validate(secret, version, strict=True)


def test_every_pod_mounts_the_jobs_token_read_only_and_tells_ray_to_require_it() -> None:
    templates = _pod_templates(desired(_job(), OWNER))
    assert len(templates) == len(ROLES)
    for template in templates:
        pod = template["spec"]
        (container,) = pod["containers"]
        volume = next(v for v in pod["volumes"] if v["name"] == "ray-token")
        assert volume["secret"] == {"secretName": "a-ray-token", "defaultMode": 0o440}
        assert {"name": "ray-token", "mountPath": TOKEN_DIR, "readOnly": True} in container["volumeMounts"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (env[AUTH_MODE_ENV], env[TOKEN_PATH_ENV]) == ("token", TOKEN_PATH)


def test_the_job_policy_selects_exactly_the_jobs_pods_and_the_dist_policy_its_rollout_and_train_pods() -> None:
    mine, other = desired(_job(), OWNER), desired(_job("metadata.name=b"), None)
    policies = _policies(mine)
    assert set(policies) == {"a-pods", "a-dist"}
    pods_a = [(t["metadata"]["labels"]["app.kubernetes.io/component"], t["metadata"]["labels"]) for t in _pod_templates(mine)]
    pods_b = [t["metadata"]["labels"] for t in _pod_templates(other)]
    job_policy, dist = policies["a-pods"]["spec"], policies["a-dist"]["spec"]
    for spec, wanted in ((job_policy, set(ROLES)), (dist, {"rollout", "train"})):
        assert spec["policyTypes"] == ["Ingress"]
        assert {role for role, labels in pods_a if _selects(spec["podSelector"], labels)} == wanted
        assert not any(_selects(spec["podSelector"], labels) for labels in pods_b), "another job's pods"
    (peers,) = job_policy["ingress"][0]["from"]
    assert {role for role, labels in pods_a if _selects(peers["podSelector"], labels)} == set(ROLES)
    assert not any(_selects(peers["podSelector"], labels) for labels in pods_b)
    assert "namespaceSelector" not in peers, "the job's namespace only"
    (dist_peers,) = dist["ingress"][0]["from"]
    assert {role for role, labels in pods_a if _selects(dist_peers["podSelector"], labels)} == {"rollout", "train"}


def test_from_outside_the_job_only_the_metrics_ports_are_open() -> None:
    spec = _policies(desired(_job(), OWNER))["a-pods"]["spec"]
    open_to_all = [rule for rule in spec["ingress"] if "from" not in rule]
    assert [p["port"] for rule in open_to_all for p in rule["ports"]] == [HTTP_PORT, POD_PORTS.named()["ray-metrics"]]


def test_the_ports_the_policy_names_are_the_ports_ray_is_started_with_on_a_pod(monkeypatch: pytest.MonkeyPatch,
                                                                               tmp_path: Path) -> None:
    started: list[tuple[list[str], dict[str, str]]] = []

    class Popen:
        def __init__(self, argv: list[str], env: dict[str, str], **_: Any) -> None:
            started.append((argv, env))

    monkeypatch.setattr(subprocess, "Popen", Popen)
    monkeypatch.delenv(node.PORT_BASE_ENV, raising=False)
    for key, value in environment("a", "controller").items():
        monkeypatch.setenv(key, value)
    node.start_head(RAY_GCS_PORT, "controller", tmp_path / "head.log")
    node.join(f"a-controller-0.a-controller:{RAY_GCS_PORT}", "rollout", tmp_path / "join.log")
    (head_argv, head_env), (join_argv, join_env) = started
    for env in (head_env, join_env):
        assert (env[AUTH_MODE_ENV], env[TOKEN_PATH_ENV]) == ("token", TOKEN_PATH)
    head, joined = _flag_ports(head_argv), _flag_ports(join_argv)
    assert head["port"] == RAY_GCS_PORT
    assert set(joined) == set(head) - {"port", "ray-client-server-port"}, "every node fixes the same ports"
    assert all(joined[k] == head[k] for k in joined)
    rule = _policies(desired(_job(), OWNER))["a-pods"]["spec"]["ingress"][0]
    named = {p["port"] for p in rule["ports"] if "endPort" not in p}
    (workers,) = [(p["port"], p["endPort"]) for p in rule["ports"] if "endPort" in p]
    assert workers == (head["min-worker-port"], head["max-worker-port"])
    assert named == {v for k, v in head.items() if "worker" not in k} | {HTTP_PORT}


def test_every_port_a_container_declares_is_one_the_policy_lets_the_jobs_pods_reach() -> None:
    objects = desired(_job(), OWNER)
    rule = _policies(objects)["a-pods"]["spec"]["ingress"][0]
    allowed = {p["port"] for p in rule["ports"]}
    for template in _pod_templates(objects):
        ports = template["spec"]["containers"][0]["ports"]
        assert {p["containerPort"] for p in ports} <= allowed
        assert all(len(p["name"]) <= 15 for p in ports)


def test_ray_runs_with_token_authentication_when_the_environment_says_so_or_holds_a_token() -> None:
    assert auth_env({})[AUTH_MODE_ENV] == "disabled"
    assert auth_env({TOKEN_PATH_ENV: "/t"})[AUTH_MODE_ENV] == "token"
    assert auth_env({"RAY_AUTH_TOKEN": "x"})[AUTH_MODE_ENV] == "token"
    assert auth_env({AUTH_MODE_ENV: "token"})[AUTH_MODE_ENV] == "token", "no token then: Ray refuses to start"
    assert auth_env({AUTH_MODE_ENV: "disabled", TOKEN_PATH_ENV: "/t"})[AUTH_MODE_ENV] == "disabled"


def test_nodes_sharing_one_host_get_disjoint_blocks_of_64_ports() -> None:
    def ports(base: int) -> set[int]:
        block = RayPorts(base, 48)
        return {*block.named().values(), *range(block.workers[0], block.workers[1] + 1)}

    assert ports(30000) <= set(range(30000, 30064)) and not ports(30000) & ports(30064)
    assert POD_PORTS.workers == (20016, 21015)
