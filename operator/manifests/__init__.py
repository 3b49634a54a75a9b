"""Pure builders: an RLJob in, the Kubernetes objects that run it out (no client, no I/O).

The operator applies what `desired` returns, `rhymerl render` prints it, and the distributed runtime
reads its commands, environment and ports from `roles` — one definition for all three.
"""

from rhymerl.api.roles import ROLES, Role
from rhymerl.operator.manifests.builders import (
    RESOURCES,
    SPEC_HASH_ANNOTATION,
    Owner,
    desired,
    replicas,
    rollout_replicas,
    spec_hash,
    spec_yaml,
    to_yaml,
)
from rhymerl.operator.manifests.labels import labels, selector, selector_string
from rhymerl.operator.manifests.roles import child_name

__all__ = [
    "RESOURCES",
    "ROLES",
    "SPEC_HASH_ANNOTATION",
    "Owner",
    "Role",
    "child_name",
    "desired",
    "labels",
    "replicas",
    "rollout_replicas",
    "selector",
    "selector_string",
    "spec_hash",
    "spec_yaml",
    "to_yaml",
]
