"""Who the job's pods are to the cluster and to each other: the controller's RBAC (its own job's status)
and the Ray token Secret every pod mounts."""

from __future__ import annotations

from rhymerl.api.crd import PLURAL
from rhymerl.api.spec import GROUP, RLJob
from rhymerl.operator.manifests.objects import Manifest, Owner, child_metadata, namespace_of
from rhymerl.operator.manifests.roles import child_name
from rhymerl.workers.runtime.ray_network import TOKEN_KEY


def controller_rbac(job: RLJob, owner: Owner | None) -> list[Manifest]:
    """The controller pod's identity: it may read its own RLJob and patch that job's status (it writes
    status.progress), nothing else."""
    job_name = job.metadata.name
    name = child_name(job_name, "controller")
    own = [job_name]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": child_metadata(job, name, owner, "controller")},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": child_metadata(job, name, owner, "controller"),
         "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": [*own], "verbs": ["get"]},
                   {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "resourceNames": [*own],
                    "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": child_metadata(job, name, owner, "controller"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace_of(job)}]},
    ]


def ray_token_name(job_name: str) -> str:
    return child_name(job_name, "ray-token")


def ray_token_secret(job: RLJob, owner: Owner | None, token: str) -> Manifest:
    """The job's Ray token, which every pod mounts (roles.environment points Ray at it). Not in
    `desired`: the operator creates it once and never rewrites it (a new token each pass would lock
    out the running pods), so it is immutable; it goes with the RLJob through its ownerReference."""
    meta = child_metadata(job, ray_token_name(job.metadata.name), owner)
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "immutable": True,
            "stringData": {TOKEN_KEY: token}}
