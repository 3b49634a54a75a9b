"""Whether a node is being taken away, from its taints. Pure: the reconciler reads the nodes' taints from
the operator's Node informer (watch.py) and counts a pod that goes away from such a node as a preemption,
not a crash (pods.py).

Why the taints as well as the pod's DisruptionTarget condition: not every way a node goes sets that
condition on its pods (a termination handler or a script that deletes pods directly, a cluster older than
1.26, a pod whose deletion the taint manager never got to). A taint on the node says it all the same. Only
taints that mean the node is going count: node loss (`unreachable` / `not-ready` with NoExecute, set by the
node lifecycle controller), an out-of-service or shut-down node, and the taints cloud termination handlers
and node autoscalers put on a node before they remove it. A spot pool's own permanent taint (e.g. AKS's
`kubernetes.azure.com/scalesetpriority=spot`) and a plain cordon are not among them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# taint key -> what it says; NODE_LOSS keys count only with the NoExecute effect (a NoSchedule one is a
# node that is merely not ready to take new pods)
NODE_LOSS: dict[str, str] = {
    "node.kubernetes.io/unreachable": "node lost (unreachable)",
    "node.kubernetes.io/not-ready": "node lost (not ready)",
}
TERMINATION: dict[str, str] = {
    "node.kubernetes.io/out-of-service": "node out of service",
    "node.cloudprovider.kubernetes.io/shutdown": "node shut down",
    "cloud.google.com/impending-node-termination": "GKE node termination",
    "aws-node-termination-handler/spot-itn": "AWS spot interruption",
    "aws-node-termination-handler/asg-lifecycle-termination": "AWS auto scaling group termination",
    "aws-node-termination-handler/scheduled-maintenance": "AWS scheduled maintenance",
    "ToBeDeletedByClusterAutoscaler": "removed by the cluster autoscaler",
    "karpenter.sh/disrupted": "disrupted by Karpenter",
    "karpenter.sh/disruption": "disrupted by Karpenter",
}


def disruption(name: str, taints: Sequence[Mapping[str, Any]]) -> str | None:
    """Why node `name` is being taken away, from its `taints` (spec.taints), or None."""
    for taint in taints:
        key = str(taint.get("key") or "")
        if key in NODE_LOSS and taint.get("effect") == "NoExecute":
            return f"NodeTaint: {NODE_LOSS[key]}: node {name} has the taint {key}:NoExecute"
        if key in TERMINATION:
            return f"NodeTaint: {TERMINATION[key]}: node {name} has the taint {key}"
    return None


def trimmed(node: Mapping[str, Any]) -> dict[str, Any]:
    """What the Node informer keeps of a node: its name, resourceVersion and taints (a node object also holds
    its images, addresses and capacity: tens of kilobytes each, in a cluster of thousands)."""
    meta = node.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion")},
            "spec": {"taints": list((node.get("spec") or {}).get("taints") or [])}}
