"""RLJob -> the Kubernetes objects that run it: pure functions, the same answer for the same job.

`desired(job, owner)` lists every child in a fixed order (ConfigMap, RBAC, Services, StatefulSets,
PodDisruptionBudgets, NetworkPolicies; roles in ROLES order), each with the job's namespace, the
app.kubernetes.io labels and, given an owner, an ownerReference, so that deleting the RLJob deletes
them all. The operator converges the cluster to this list; `rhymerl render` prints it. The job's Ray
token Secret (`ray_token_secret`) is apart: the operator creates it once, never converges it.
"""

from __future__ import annotations

import yaml

from rhymerl.api.roles import ROLES, Role
from rhymerl.api.spec import RLJob
from rhymerl.operator.manifests.access import controller_rbac
from rhymerl.operator.manifests.network import network_policies, service
from rhymerl.operator.manifests.objects import Manifest, Owner
from rhymerl.operator.manifests.replicas import most_replicas
from rhymerl.operator.manifests.spec_config import config_map, spec_hash
from rhymerl.operator.manifests.workloads import disruption_budget, stateful_set

_DISRUPTABLE: tuple[Role, ...] = ("rollout", "reward", "history")  # may lose a pod at a time
# kind -> (API group, resource) of every kind `desired` returns: for API calls and RBAC rules.
RESOURCES: dict[str, tuple[str, str]] = {
    "ConfigMap": ("", "configmaps"),
    "ServiceAccount": ("", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
    "Service": ("", "services"),
    "StatefulSet": ("apps", "statefulsets"),
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
    "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
}


def desired(job: RLJob, owner: Owner | None) -> list[Manifest]:
    """Every child of `job`, in a fixed order. Without an owner (a dry run) there are no ownerReferences.

    PodDisruptionBudgets exist for the roles that can lose one pod at a time and may have two or more
    (rollout up to max_replicas, reward, history); the controller and train pods are single or in
    lockstep, where a budget would only block node drains (their progress is in checkpoints)."""
    digest = spec_hash(job)
    objects = [config_map(job, owner), *controller_rbac(job, owner)]
    objects += [service(job, role, owner) for role in ROLES]
    objects += [stateful_set(job, role, owner, digest) for role in ROLES]
    objects += [disruption_budget(job, role, owner) for role in _DISRUPTABLE
                if most_replicas(job.spec, role) >= 2]
    objects += network_policies(job, owner)
    return objects


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the ConfigMap's spec.yaml) as literal blocks, readable in a diff."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def to_yaml(objects: list[Manifest]) -> str:
    """A multi-document YAML stream of `objects`, as `kubectl apply -f -` reads it."""
    return yaml.dump_all(objects, Dumper=_BlockDumper, sort_keys=False, explicit_start=True, width=120)
