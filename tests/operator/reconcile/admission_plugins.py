"""The admission a pod create passes in the kube emulator, in the API server's order: Pod Security
(pod_security.py), validating webhooks, then ResourceQuota (the last validating plugin). A refusal is an
HTTP status and the API server's message, which the StatefulSet controller quotes in its FailedCreate
event. Pure: the emulator hands in the namespace's labels, quotas, live pods and registered webhooks.

ResourceQuota: k8s.io/apiserver's quota admission, plugin/pkg/admission/resourcequota/controller.go
(`CheckRequest`): a pod whose usage would take any resource past a quota's `hard` is refused `exceeded
quota: <quota>, requested: <r>, used: <u>, limited: <l>` (prettyPrint: `key=quantity` sorted, joined by
","; only the exceeded resources); a quota on cpu or memory refuses a pod one of whose containers does not
state that resource (`failed quota: <quota>: must specify ...`, pkg/quota/v1/evaluator/core/pods.go,
enforcePodContainerConstraints). Usage (pods.go, PodUsageFunc): `pods` 1, `requests.*` and `limits.*`
(`cpu` and `memory` also unprefixed) as the sum over containers or the largest init container, whichever is
more, for pods not Succeeded or Failed. Wrapped as admission.NewForbidden does: `pods "<name>" is
forbidden: ...`, status 403.

Webhooks: k8s.io/apiserver pkg/admission/plugin/webhook/errors/statuserror.go (`ToStatusErr`): a denial
reads `admission webhook "<name>" denied the request: <message>`, with the webhook's code (at least 400).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pod_security

Pod = Mapping[str, Any]
# a validating webhook: its denial (HTTP code, message) for a pod, or None to allow it
Webhook = Callable[[Pod], tuple[int, str] | None]

_BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL = {"n": Fraction(1, 10 ** 9), "u": Fraction(1, 10 ** 6), "m": Fraction(1, 1000), "": Fraction(1),
            "k": Fraction(10 ** 3), "M": Fraction(10 ** 6), "G": Fraction(10 ** 9), "T": Fraction(10 ** 12),
            "P": Fraction(10 ** 15), "E": Fraction(10 ** 18)}
_UNPREFIXED = ("cpu", "memory")  # a quota may name these without "requests."


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str
    message: str


def quantity(text: str | int | float) -> Fraction:
    """A resource.Quantity's value ("500m", "2", "1Gi", "1e3")."""
    raw = str(text).strip()
    for suffix, factor in _BINARY.items():
        if raw.endswith(suffix):
            return Fraction(raw[: -len(suffix)]) * factor
    if raw[-1:] in _DECIMAL and raw[-1:] != "":
        return Fraction(raw[:-1]) * _DECIMAL[raw[-1]]
    return Fraction(raw)


def shown(resource: str, value: Fraction) -> str:
    """`value` as Quantity.String() writes it for the usual cases: whole numbers plain (memory in the largest
    binary unit that divides it), fractions in milli-units."""
    if value.denominator == 1:
        whole = int(value)
        if "memory" in resource or "storage" in resource:
            for suffix, factor in reversed(list(_BINARY.items())):
                if whole and whole % factor == 0:
                    return f"{whole // factor}{suffix}"
        return str(whole)
    milli = value * 1000
    return f"{int(milli)}m" if milli.denominator == 1 else f"{int(value * 10 ** 9)}n"


def _amounts(container: Mapping[str, Any], part: str) -> dict[str, Fraction]:
    return {k: quantity(v) for k, v in ((container.get("resources") or {}).get(part) or {}).items()}


def usage(pod: Pod) -> dict[str, Fraction]:
    """What `pod` counts against a quota (PodUsageFunc)."""
    spec = pod.get("spec") or {}
    out: dict[str, Fraction] = {"pods": Fraction(1)}
    for part in ("requests", "limits"):
        summed: dict[str, Fraction] = {}
        for container in spec.get("containers") or []:
            for key, value in _amounts(container, part).items():
                summed[key] = summed.get(key, Fraction(0)) + value
        for init in spec.get("initContainers") or []:
            for key, value in _amounts(init, part).items():
                summed[key] = max(summed.get(key, Fraction(0)), value)
        for key, value in summed.items():
            out[f"{part}.{key}"] = value
            if part == "requests" and key in _UNPREFIXED:
                out[key] = value
    return out


def counted(pod: Pod) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _missing(pod: Pod, hard: Mapping[str, Any]) -> str | None:
    """`must specify` for the cpu and memory resources the quota tracks that some container leaves unset."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    parts = []
    for tracked in sorted(hard):
        part, _, key = tracked.rpartition(".") if "." in tracked else ("requests", "", tracked)
        if key not in _UNPREFIXED or part not in ("requests", "limits"):
            continue
        lacking = [c["name"] for c in containers if key not in ((c.get("resources") or {}).get(part) or {})]
        if lacking:
            parts.append(f"{part}.{key} for: {','.join(lacking)}")
    return f"must specify {'; '.join(parts)}" if parts else None


def _listed(keys: Sequence[str], values: Mapping[str, Fraction]) -> str:
    """prettyPrint: `key=quantity`, joined by ","."""
    return ",".join(f"{k}={shown(k, values[k])}" for k in keys)


def quota_refusal(pod: Pod, quotas: Sequence[Mapping[str, Any]], live: Sequence[Pod]) -> str | None:
    """Why the ResourceQuotas `quotas` refuse `pod` beside the namespace's `live` pods, or None."""
    name = (pod.get("metadata") or {}).get("name", "")
    wanted = usage(pod)
    for quota in sorted(quotas, key=lambda q: q["metadata"]["name"]):
        hard = {k: quantity(v) for k, v in ((quota.get("spec") or {}).get("hard") or {}).items()}
        qname = quota["metadata"]["name"]
        missing = _missing(pod, hard)
        if missing is not None:
            return f'pods "{name}" is forbidden: failed quota: {qname}: {missing}'
        used = {k: sum((usage(p).get(k, Fraction(0)) for p in live if counted(p)), Fraction(0)) for k in hard}
        exceeded = sorted(k for k in hard if k in wanted and used[k] + wanted[k] > hard[k])
        if exceeded:
            requested, now, limited = (_listed(exceeded, values) for values in (wanted, used, hard))
            return (f'pods "{name}" is forbidden: exceeded quota: {qname}, requested: {requested}, '
                    f"used: {now}, limited: {limited}")
    return None


def webhook_refusal(pod: Pod, webhooks: Mapping[str, Webhook]) -> Refusal | None:
    for hook, decide in webhooks.items():
        denied = decide(pod)
        if denied is not None:
            code, message = denied
            said = f": {message}" if message else " without explanation"
            return Refusal(max(code, 400), "Forbidden" if code == 403 else "BadRequest",
                           f'admission webhook "{hook}" denied the request{said}')
    return None


def admit(pod: Pod, namespace_labels: Mapping[str, str], quotas: Sequence[Mapping[str, Any]],
          live: Sequence[Pod], webhooks: Mapping[str, Webhook]) -> Refusal | None:
    """The first refusal of `pod`'s create, in the API server's order, or None to store it."""
    security = pod_security.refusal(pod, namespace_labels)
    if security is not None:
        return Refusal(403, "Forbidden", security)
    hooked = webhook_refusal(pod, webhooks)
    if hooked is not None:
        return hooked
    quota = quota_refusal(pod, quotas, live)
    return None if quota is None else Refusal(403, "Forbidden", quota)
