"""Why pods of a job do not exist: the pod creates the API server refused at admission. Pure.

A ResourceQuota, Pod Security admission or a validating webhook refuses a pod create; the pod never
exists, so nothing about it is in the pods the operator watches. The StatefulSet controller records each
refusal as a Warning event FailedCreate on the set, `create Pod <pod> in StatefulSet <set> failed error:
<the API server's message>` (kubernetes pkg/controller/statefulset/stateful_pod_control.go, CreateStatefulPod
and recordPodEvent), and tries again with backoff. The operator reads those events only for a set its
controller has synced and that misses pods (`short`: one list per such set and pass, none for a job whose
pods all exist) and reports the latest refusal of each pod still missing (`refusals`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FAILED_CREATE = "FailedCreate"
_MESSAGE = re.compile(r"create Pod (?P<pod>\S+) in StatefulSet (?P<set>\S+) failed error: (?P<error>.*)", re.DOTALL)


@dataclass(frozen=True)
class Short:
    """A StatefulSet of the job with pods missing (its ordinals below spec.replicas that no pod has)."""

    statefulset: str
    uid: str
    missing: tuple[str, ...]

    def field_selector(self) -> str:
        """The FailedCreate events of this very set (not those of an earlier set of the same name)."""
        return (f"involvedObject.kind=StatefulSet,involvedObject.name={self.statefulset},"
                f"involvedObject.uid={self.uid},reason={FAILED_CREATE}")


def _synced(sts: Mapping[str, Any]) -> bool:
    """The StatefulSet controller has acted on this generation of the set (before, it refused nothing)."""
    observed = (sts.get("status") or {}).get("observedGeneration")
    return isinstance(observed, int) and observed >= int((sts.get("metadata") or {}).get("generation") or 0)


def short(children: Sequence[Mapping[str, Any]], pod_names: Sequence[str]) -> list[Short]:
    """The job's StatefulSets (among `children`) that their controller synced and that miss pods, given the
    names of the pods that exist."""
    present = set(pod_names)
    out = []
    for child in children:
        if child.get("kind") != "StatefulSet" or not _synced(child):
            continue
        meta = child.get("metadata") or {}
        name = str(meta.get("name") or "")
        wanted = int((child.get("spec") or {}).get("replicas") or 0)
        missing = tuple(p for p in (f"{name}-{i}" for i in range(wanted)) if p not in present)
        if missing and meta.get("uid"):
            out.append(Short(name, str(meta["uid"]), missing))
    return out


def _when(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or (event.get("series") or {}).get("lastObservedTime")
               or event.get("eventTime") or event.get("firstTimestamp") or "")


def refusals(events: Sequence[Mapping[str, Any]], shorts: Sequence[Short]) -> tuple[str, ...]:
    """`pod <name>: <the API server's message>` for each missing pod the latest FailedCreate event names."""
    missing = {(s.statefulset, s.uid, pod) for s in shorts for pod in s.missing}
    latest: dict[str, tuple[str, str]] = {}
    for event in events:
        found = _MESSAGE.fullmatch(str(event.get("message") or ""))
        involved = event.get("involvedObject") or {}
        if event.get("reason") != FAILED_CREATE or found is None:
            continue
        key = (str(involved.get("name") or ""), str(involved.get("uid") or ""), found["pod"])
        when = _when(event)
        if key in missing and (found["pod"] not in latest or latest[found["pod"]][0] <= when):
            latest[found["pod"]] = (when, found["error"].strip())
    return tuple(f"pod {pod}: {error}" for pod, (_, error) in sorted(latest.items()))
