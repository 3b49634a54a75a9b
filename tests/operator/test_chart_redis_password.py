"""The chart's Redis password (charts/rhymerl, redis.auth): a zero-config `redis.enabled=true` renders no
password at all, so every `helm template` gives the same manifests; the operator creates the Secret of
that fixed name once, at start-up (operator/reconcile/redis_secret.py), with a Role for that and no more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from helm_runner import CHART, run_helm

NAMESPACE = "rl"
SECRET = "rhymerl-redis"  # <release>-redis: what jobs name in history.redisPasswordSecret


def _render(helm: Path, *sets: str) -> tuple[str, list[dict[str, Any]]]:
    res = run_helm(helm, "template", "rhymerl", str(CHART), "--namespace", NAMESPACE,
                   *(arg for s in sets for arg in ("--set", s)))
    assert res.returncode == 0, res.stderr
    return res.stdout, [d for d in yaml.safe_load_all(res.stdout) if d]


def _deployment(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name)


def _env(deployment: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in
            deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_a_zero_config_redis_renders_the_same_manifests_twice_and_no_password_anywhere(helm: Path) -> None:
    first, objects = _render(helm, "redis.enabled=true")
    second, _ = _render(helm, "redis.enabled=true")
    assert first == second
    assert [o for o in objects if o["kind"] == "Secret"] == []
    assert not [o for o in objects if "data" in o or "stringData" in o], "no Secret or ConfigMap holds a password"
    redis = _deployment(objects, SECRET)
    assert _env(redis) == {"REDIS_PASSWORD": {"secretKeyRef": {"name": SECRET, "key": "redis-password"}}}, \
        "not optional: the Redis pod waits (CreateContainerConfigError, retried) until the operator made it"
    operator = _env(_deployment(objects, "rhymerl"))
    assert operator["RHYMERL_REDIS_SECRET"] == SECRET and operator["RHYMERL_REDIS_SECRET_KEY"] == "redis-password"
    assert "RHYMERL_REDIS_PASSWORD" not in operator, "the operator must start before the Secret exists"
    assert operator["RHYMERL_REDIS_ENDPOINTS"] == f"{SECRET}.{NAMESPACE}.svc.cluster.local:6379"


def _rules(objects: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == name)
    assert role["metadata"]["namespace"] == NAMESPACE
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def test_the_operator_may_create_secrets_and_read_only_the_redis_one_in_its_own_namespace(helm: Path) -> None:
    for sets in [("operator.watchNamespace=jobs",), ()]:
        _, objects = _render(helm, "redis.enabled=true", *sets)
        assert _rules(objects, "rhymerl-redis-password") == [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET], "verbs": ["get"]}]
        binding = next(o for o in objects if o["kind"] == "RoleBinding"
                       and o["metadata"]["name"] == "rhymerl-redis-password")
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": "rhymerl-redis-password"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rhymerl", "namespace": NAMESPACE}]
        reads = [r for o in objects if o["kind"] in {"Role", "ClusterRole"} for r in o["rules"]
                 if "secrets" in r["resources"] and set(r["verbs"]) - {"create"}]
        assert reads == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET], "verbs": ["get"]}]
    for obj in objects:
        if obj["kind"] in {"Role", "RoleBinding"}:
            for version in ("1.29", "1.34"):
                kubernetes_validate.validate(obj, version, strict=True)


def test_an_explicit_password_or_existing_secret_renders_as_before_and_grants_no_secret_read(helm: Path) -> None:
    _, given = _render(helm, "redis.enabled=true", "redis.auth.password=pw-from-values")
    again = _render(helm, "redis.enabled=true", "redis.auth.password=pw-from-values")[1]
    [secret] = [o for o in given if o["kind"] == "Secret"]
    assert secret == next(o for o in again if o["kind"] == "Secret")
    assert secret["metadata"]["name"] == SECRET and secret["data"] == {"redis-password": "cHctZnJvbS12YWx1ZXM="}
    assert _env(_deployment(given, "rhymerl"))["RHYMERL_REDIS_PASSWORD"] == {
        "secretKeyRef": {"name": SECRET, "key": "redis-password"}}
    _, existing = _render(helm, "redis.enabled=true", "redis.auth.existingSecret=team-redis")
    assert "RHYMERL_REDIS_SECRET" not in _env(_deployment(existing, "rhymerl"))
    for objects in (given, existing):
        assert not [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"].endswith("-redis-password")]


def test_without_redis_nothing_of_the_password_is_rendered(helm: Path) -> None:
    _, objects = _render(helm)
    assert not [o for o in objects if o["kind"] in {"Secret", "Role"}]
    assert "RHYMERL_REDIS_SECRET" not in _env(_deployment(objects, "rhymerl"))
