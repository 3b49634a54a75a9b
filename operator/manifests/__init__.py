"""Pure builders: an RLJob in, the Kubernetes objects that run it out (no client, no I/O).

The operator applies what `desired` returns, `rhymerl render` prints it, and the distributed runtime
reads its commands, environment and ports from `roles` — one definition for all three.
"""

from rhymerl.api.roles import ROLES, Role
from rhymerl.operator.manifests.builders import RESOURCES, desired, to_yaml
from rhymerl.operator.manifests.labels import labels, selector, selector_string
from rhymerl.operator.manifests.objects import Owner
from rhymerl.operator.manifests.replicas import replicas, rollout_replicas
from rhymerl.operator.manifests.roles import child_name
from rhymerl.operator.manifests.spec_config import SPEC_HASH_ANNOTATION, spec_hash, spec_yaml

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
