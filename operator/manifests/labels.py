"""The labels every child of an RLJob carries, after the `app.kubernetes.io/*` conventions.

Selectors use only the labels that never change for a pod's lifetime (name, instance, component):
a StatefulSet's selector is immutable, so nothing versioned or descriptive may be in it.
"""

from __future__ import annotations

from rhymerl.api.spec import KUEUE_QUEUE_LABEL as KUEUE_QUEUE_LABEL

NAME = "rhymerl"
MANAGED_BY = "rhymerl-operator"
NAME_KEY = "app.kubernetes.io/name"
INSTANCE_KEY = "app.kubernetes.io/instance"
COMPONENT_KEY = "app.kubernetes.io/component"
PART_OF_KEY = "app.kubernetes.io/part-of"
MANAGED_BY_KEY = "app.kubernetes.io/managed-by"
# Kueue's plain-pod groups (its `pod` integration): the queue (KUEUE_QUEUE_LABEL), the group, its size.
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"


def labels(job_name: str, role: str | None = None) -> dict[str, str]:
    """Labels of a child of job `job_name`; `role` is set for the objects of one role."""
    out = {NAME_KEY: NAME, INSTANCE_KEY: job_name}
    if role is not None:
        out[COMPONENT_KEY] = role
    out[PART_OF_KEY] = NAME
    out[MANAGED_BY_KEY] = MANAGED_BY
    return out


def selector(job_name: str, role: str) -> dict[str, str]:
    """matchLabels of the pods of one role of one job."""
    return {NAME_KEY: NAME, INSTANCE_KEY: job_name, COMPONENT_KEY: role}


def job_selector(job_name: str) -> dict[str, str]:
    """matchLabels of every pod of one job, all roles."""
    return {NAME_KEY: NAME, INSTANCE_KEY: job_name}


def selector_string(job_name: str, role: str) -> str:
    """The same selector as a label-selector string (status.selector, for the scale subresource and HPA)."""
    return ",".join(f"{key}={value}" for key, value in selector(job_name, role).items())
