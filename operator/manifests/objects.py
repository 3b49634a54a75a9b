"""What every child of an RLJob shares: its namespace, its labels and the ownerReference that deletes
it with the job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rhymerl.api.roles import Role
from rhymerl.api.spec import RLJob
from rhymerl.operator.manifests.labels import labels

Manifest = dict[str, Any]
DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True)
class Owner:
    """The RLJob object as Kubernetes knows it, for ownerReferences."""

    api_version: str
    kind: str
    name: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}


def namespace_of(job: RLJob) -> str:
    return job.metadata.namespace or DEFAULT_NAMESPACE


def child_metadata(job: RLJob, name: str, owner: Owner | None, role: Role | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace_of(job), "labels": labels(job.metadata.name, role)}
    if owner is not None:
        meta["ownerReferences"] = [owner.reference()]
    return meta
