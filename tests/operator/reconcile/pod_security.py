"""Pod Security Admission's `restricted` profile, as the kube emulator enforces it on a namespace labelled
`pod-security.kubernetes.io/enforce: restricted`: a job whose pods break a rule never starts in such a
namespace, so the emulator refuses them as the API server would. Pure.

The rules and their messages are those of k8s.io/pod-security-admission, policy/check_*.go (each check's
ForbiddenReason and ForbiddenDetail; the checks of the `restricted` level include the `baseline` ones), and
admission/admission.go, which refuses with `violates PodSecurity "restricted:latest": <reason> (<detail>),
...`, the checks in the order of their ids. Rules of baseline this emulator leaves out (AppArmor, SELinux,
procMount, sysctls, Windows host process) are none the operator's pods touch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
# policy/check_restrictedVolumes.go: the only volume types `restricted` allows
ALLOWED_VOLUMES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                   "secret")
SECCOMP_OK = ("RuntimeDefault", "Localhost")
Spec = Mapping[str, Any]
Finding = tuple[str, str]  # (ForbiddenReason, ForbiddenDetail)


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _who(names: Sequence[str], one: str = "container", many: str = "containers") -> str:
    return f"{one if len(names) == 1 else many} {_quoted(names)}"


def _containers(spec: Spec) -> list[Mapping[str, Any]]:
    """Every container, init and ephemeral ones included (policy/visitor.go, visitContainers)."""
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or []),
            *(spec.get("ephemeralContainers") or [])]


def _sc(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return container.get("securityContext") or {}


def _allow_privilege_escalation(spec: Spec) -> list[Finding]:
    bad = [c["name"] for c in _containers(spec) if _sc(c).get("allowPrivilegeEscalation") is not False]
    return [("allowPrivilegeEscalation != false",
             f"{_who(bad)} must set securityContext.allowPrivilegeEscalation=false")] if bad else []


def _capabilities(spec: Spec) -> list[Finding]:
    no_drop = [c["name"] for c in _containers(spec) if "ALL" not in ((_sc(c).get("capabilities") or {}).get("drop") or [])]
    adders = {c["name"]: [a for a in (_sc(c).get("capabilities") or {}).get("add") or [] if a != "NET_BIND_SERVICE"]
              for c in _containers(spec)}
    bad_add = [n for n, added in adders.items() if added]
    details = [f'{_who(no_drop)} must set securityContext.capabilities.drop=["ALL"]'] if no_drop else []
    if bad_add:
        added = sorted({a for n in bad_add for a in adders[n]})
        details.append(f"{_who(bad_add)} must not include {_quoted(added)} in securityContext.capabilities.add")
    return [("unrestricted capabilities", "; ".join(details))] if details else []


def _host_namespaces(spec: Spec) -> list[Finding]:
    bad = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    return [("host namespaces", ", ".join(bad))] if bad else []


def _host_path_volumes(spec: Spec) -> list[Finding]:
    bad = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    return [("hostPath volumes", _who(bad, "volume", "volumes"))] if bad else []


def _host_ports(spec: Spec) -> list[Finding]:
    bad = [(c["name"], str(p["hostPort"])) for c in _containers(spec) for p in c.get("ports") or [] if p.get("hostPort")]
    if not bad:
        return []
    names = sorted({n for n, _ in bad})
    return [("hostPort", f"{_who(names)} {'uses' if len(names) == 1 else 'use'} "
             f"{'hostPort' if len(bad) == 1 else 'hostPorts'} {', '.join(p for _, p in bad)}")]


def _privileged(spec: Spec) -> list[Finding]:
    bad = [c["name"] for c in _containers(spec) if _sc(c).get("privileged")]
    return [("privileged", f"{_who(bad)} must not set securityContext.privileged=true")] if bad else []


def _restricted_volumes(spec: Spec) -> list[Finding]:
    bad: list[tuple[str, str]] = []
    for volume in spec.get("volumes") or []:
        kinds = [k for k in volume if k != "name"]
        if kinds and kinds[0] not in ALLOWED_VOLUMES:
            bad.append((volume["name"], kinds[0]))
    if not bad:
        return []
    names, kinds = [n for n, _ in bad], sorted({k for _, k in bad})
    verb = "uses" if len(names) == 1 else "use"
    types = "restricted volume type" if len(kinds) == 1 else "restricted volume types"
    return [("restricted volume types", f"{_who(names, 'volume', 'volumes')} {verb} {types} {_quoted(kinds)}")]


def _run_as_non_root(spec: Spec) -> list[Finding]:
    pod = (spec.get("securityContext") or {}).get("runAsNonRoot")
    explicit = [c["name"] for c in _containers(spec) if _sc(c).get("runAsNonRoot") is False]
    implicit = [c["name"] for c in _containers(spec) if _sc(c).get("runAsNonRoot") is None]
    details = ["pod must not set securityContext.runAsNonRoot=false"] if pod is False else []
    if explicit:
        details.append(f"{_who(explicit)} must not set securityContext.runAsNonRoot=false")
    if pod is None and implicit:
        details.append(f"pod or {_who(implicit)} must set securityContext.runAsNonRoot=true")
    return [("runAsNonRoot != true", "; ".join(details))] if details else []


def _run_as_user(spec: Spec) -> list[Finding]:
    details = ["pod must not set runAsUser=0"] if (spec.get("securityContext") or {}).get("runAsUser") == 0 else []
    bad = [c["name"] for c in _containers(spec) if _sc(c).get("runAsUser") == 0]
    if bad:
        details.append(f"{_who(bad)} must not set runAsUser=0")
    return [("runAsUser=0", "; ".join(details))] if details else []


def _seccomp(spec: Spec) -> list[Finding]:
    pod = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    typed = {c["name"]: (_sc(c).get("seccompProfile") or {}).get("type") for c in _containers(spec)}
    details = [f'pod must not set securityContext.seccompProfile.type to "{pod}"'] if pod and pod not in SECCOMP_OK else []
    wrong = [n for n, t in typed.items() if t and t not in SECCOMP_OK]
    if wrong:
        details.append(f'{_who(wrong)} must not set securityContext.seccompProfile.type to "Unconfined"')
    unset = [n for n, t in typed.items() if not t]
    if pod is None and unset:
        details.append(f'pod or {_who(unset)} must set securityContext.seccompProfile.type to "RuntimeDefault" or '
                       '"Localhost"')
    return [("seccompProfile", "; ".join(details))] if details else []


# in the order of the checks' ids (policy/check_*.go), which is the order of the message
CHECKS: tuple[Callable[[Spec], list[Finding]], ...] = (
    _allow_privilege_escalation, _capabilities, _host_namespaces, _host_path_volumes, _host_ports, _privileged,
    _restricted_volumes, _run_as_non_root, _run_as_user, _seccomp)


def restricted_violations(spec: Spec) -> list[str]:
    """Each broken rule of `restricted` as `<reason> (<detail>)`; empty when the pod spec passes."""
    return [f"{reason} ({detail})" for check in CHECKS for reason, detail in check(spec)]


def refusal(pod: Mapping[str, Any], namespace_labels: Mapping[str, str]) -> str | None:
    """The API server's message refusing `pod` in a namespace with `namespace_labels`, or None."""
    if namespace_labels.get(ENFORCE_LABEL) != "restricted":
        return None
    found = restricted_violations(pod.get("spec") or {})
    name = (pod.get("metadata") or {}).get("name", "")
    return f'pods "{name}" is forbidden: violates PodSecurity "restricted:latest": {", ".join(found)}' if found else None
