"""How a job's pods reach each other: headless Services for stable DNS names, and the NetworkPolicies
that admit Ray, metrics and torch.distributed traffic."""

from __future__ import annotations

from typing import Any

from rhymerl.api.roles import Role
from rhymerl.api.spec import RLJob
from rhymerl.operator.manifests.labels import COMPONENT_KEY, job_selector, selector
from rhymerl.operator.manifests.objects import Manifest, Owner, child_metadata
from rhymerl.operator.manifests.roles import HTTP_PORT, RAY_GCS_PORT, RUNTIME, child_name
from rhymerl.workers.runtime.ray_network import POD_PORTS

# Roles whose pods talk torch.distributed to each other (train ranks; weight broadcasts from train to
# rollout), over ports chosen at random: the one traffic inside a job that cannot name its ports.
_COLLECTIVES: tuple[Role, ...] = ("rollout", "train")


def service(job: RLJob, role: Role, owner: Owner | None) -> Manifest:
    """Headless: stable per-pod DNS names (`<job>-<role>-N.<job>-<role>`), published before pods are
    ready so that Ray peers find each other while starting."""
    name = child_name(job.metadata.name, role)
    ports = [{"name": p.name, "port": p.port, "targetPort": p.name, "protocol": "TCP"} for p in RUNTIME[role].ports]
    return {"apiVersion": "v1", "kind": "Service", "metadata": child_metadata(job, name, owner, role),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": selector(job.metadata.name, role), "ports": ports}}


def ray_ports() -> list[dict[str, Any]]:
    """NetworkPolicy ports of every port a pod's Ray opens (ray_network.POD_PORTS, what node.py starts
    Ray with) and the head's GCS port."""
    first, last = POD_PORTS.workers
    single = sorted({RAY_GCS_PORT, *POD_PORTS.named().values()})
    return [*({"protocol": "TCP", "port": p} for p in single), {"protocol": "TCP", "port": first, "endPort": last}]


def network_policies(job: RLJob, owner: Owner | None) -> list[Manifest]:
    """Ingress to the job's pods: Ray's ports and the http port from the job's own pods only, the
    metrics ports (Prometheus text, health; nothing that writes) from anywhere, so that any
    Prometheus can scrape them; and between rollout and train pods any port, for torch.distributed.
    Egress stays open (the API server, Redis, model and data stores). The operator needs no ingress:
    it talks to the API server only."""
    name = job.metadata.name

    def pods(roles: tuple[Role, ...] | None = None) -> dict[str, Any]:  # a fresh dict each: no YAML aliases
        chosen: dict[str, Any] = {"matchLabels": job_selector(name)}
        if roles is not None:
            chosen["matchExpressions"] = [{"key": COMPONENT_KEY, "operator": "In", "values": list(roles)}]
        return chosen

    metrics = [{"protocol": "TCP", "port": HTTP_PORT}, {"protocol": "TCP", "port": POD_PORTS.named()["ray-metrics"]}]
    return [
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": child_metadata(job, child_name(name, "pods"), owner),
         "spec": {"podSelector": pods(), "policyTypes": ["Ingress"],
                  "ingress": [{"from": [{"podSelector": pods()}],
                               "ports": [*ray_ports(), {"protocol": "TCP", "port": HTTP_PORT}]},
                              {"ports": metrics}]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
         "metadata": child_metadata(job, child_name(name, "dist"), owner),
         "spec": {"podSelector": pods(_COLLECTIVES), "policyTypes": ["Ingress"],
                  "ingress": [{"from": [{"podSelector": pods(_COLLECTIVES)}]}]}},
    ]
