"""Kubernetes' own rules for the values an RLJob hands to the API server, checked when the spec is
read: what `kubectl apply` of the rendered objects would refuse (or a kubelet fail to pull) is a
spec error naming the field and its line, not a broken job later.

Each rule mirrors Kubernetes' apimachinery (k8s.io/apimachinery/pkg/util/validation and
pkg/api/resource) or, for images, the distribution reference grammar the container runtimes
parse; every message names the rule. The sizes are the API server's and etcd's (an object's
annotations, a ConfigMap, a stored object), which a spec reaches through what it hands to the
objects the operator renders (rhymerl.api.load.size_problems checks those).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import Context, Decimal, localcontext
from typing import Annotated, Any

from pydantic import AfterValidator

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(rf"^{_LABEL}$")
DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
QUALIFIED_NAME = re.compile(rf"^{_NAME}$")
LABEL_VALUE = re.compile(rf"^({_NAME})?$")
QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
ENV_VAR_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
CONFIG_MAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
IMAGE = re.compile(rf"^(?:{_DOMAIN}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
                   r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")


def dns1123_label(value: str) -> str:
    if len(value) > 63 or not DNS1123_LABEL.match(value):
        raise ValueError(f"{value!r} is not a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting "
                         "and ending with a letter or digit (Kubernetes' IsDNS1123Label)")
    return value


def dns1123_subdomain(value: str) -> str:
    if len(value) > 253 or not DNS1123_SUBDOMAIN.match(value):
        raise ValueError(f"{value!r} is not a DNS-1123 subdomain: at most 253 characters of dot-separated lowercase "
                         "labels of letters, digits and '-' (Kubernetes' IsDNS1123Subdomain)")
    return value


def qualified_name(value: str) -> str:
    """A label, annotation, node-selector or taint key: an optional DNS-1123 subdomain prefix and '/',
    then a name of at most 63 characters."""
    prefix, slash, name = value.rpartition("/")
    if (slash and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix))) \
            or len(name) > 63 or not QUALIFIED_NAME.match(name):
        raise ValueError(f"{value!r} is not a qualified name: an optional DNS-1123 subdomain prefix and '/', then at "
                         "most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit "
                         "(Kubernetes' IsQualifiedName)")
    return value


def label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise ValueError(f"{value!r} is not a label value: empty, or at most 63 letters, digits, '-', '_' or '.', "
                         "starting and ending with a letter or digit (Kubernetes' IsValidLabelValue)")
    return value


def _chdir_prefix(value: str) -> str | None:
    """Kubernetes' hasChDirPrefix: '.', '..' and a leading '..' are refused in names a path may be made of."""
    if value in (".", ".."):
        return f"may not be '{value}'"
    return "may not start with '..'" if value.startswith("..") else None


def env_var_name(value: str) -> str:
    why = _chdir_prefix(value)
    if why is not None or not ENV_VAR_NAME.match(value):
        raise ValueError(f"{value!r} is not an environment variable name: letters, digits, '-', '.' and '_', not "
                         f"starting with a digit{'; ' + why if why else ''} (Kubernetes' IsEnvVarName)")
    return value


def config_map_key(value: str) -> str:
    why = _chdir_prefix(value)
    if why is not None or len(value) > 253 or not CONFIG_MAP_KEY.match(value):
        raise ValueError(f"{value!r} is not a ConfigMap or Secret key: at most 253 letters, digits, '-', '.' and "
                         f"'_'{'; ' + why if why else ''} (Kubernetes' IsConfigMapKey)")
    return value


MAX_ANNOTATION_BYTES = 256 << 10  # apimachinery's TotalAnnotationSizeLimitB: an object's keys and values together
MAX_CONFIG_MAP_BYTES = 1 << 20  # core/v1 validation (MaxSecretSize): a ConfigMap's values together
MAX_OBJECT_BYTES = 1536 << 10  # etcd's --max-request-bytes default: one object as the API server stores it


def annotation_bytes(annotations: Mapping[str, str]) -> int:
    """Bytes of `annotations`' keys and values, as the API server counts them (UTF-8)."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())


def annotations_within(annotations: dict[str, str], limit: int = MAX_ANNOTATION_BYTES) -> dict[str, str]:
    """`annotations` if they fit `limit`: the API server's 256 KiB, or less where the operator adds its own."""
    size = annotation_bytes(annotations)
    if size > limit:
        raise ValueError(f"{size} bytes of keys and values, more than the {limit} they may hold here (Kubernetes' "
                         "TotalAnnotationSizeLimitB: 256 KiB an object, the operator's own annotations included)")
    return annotations


def yaml_bytes_bound(data: Any) -> int:
    """An upper bound of the YAML that yaml.safe_dump writes of `data` (JSON-shaped): each byte of its
    compact JSON becomes at most one line's indentation (two spaces a level), an escape and a line
    break, so (2 * depth + 8) bytes. A cheap stand-in for dumping; far above the dump, never below it."""
    depth, pending = 0, [(data, 1)]
    while pending:
        node, level = pending.pop()
        depth = max(depth, level)
        if isinstance(node, dict):
            pending += [(v, level + 1) for v in node.values()]
        elif isinstance(node, list):
            pending += [(v, level + 1) for v in node]
    return json_bytes(data) * (2 * depth + 8) + 64


def json_bytes(data: Any) -> int:
    """Bytes of `data` as compact JSON, as a client sends an object to the API server."""
    return len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())


def quantity(value: str | int) -> str | int:
    """A non-negative resource quantity: a number and an optional SI (m, k, M, G...), binary (Ki, Mi,
    Gi...) or exponent (e3) suffix, no space."""
    if isinstance(value, bool) or (isinstance(value, int) and value < 0):
        raise ValueError(f"{value!r} is not a non-negative quantity (Kubernetes' resource.Quantity)")
    if isinstance(value, str) and not QUANTITY.match(value):
        raise ValueError(f"{value!r} is not a non-negative quantity such as '500m', '4', '64Gi' or '1e9': a number "
                         "and one of the suffixes n u m k M G T P E, Ki Mi Gi Ti Pi Ei or e<N>, nothing between "
                         "them (Kubernetes' resource.Quantity; 'GB' is not a suffix, 'G' or 'Gi' is)")
    if (value if isinstance(value, int) else _magnitude(value)) > MAX_QUANTITY:
        raise ValueError(f"{value!r} is more than 2^63-1, which no quantity may represent (Kubernetes' "
                         "resource.Quantity)")
    return value


MAX_QUANTITY = 2**63 - 1
_SCALE = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal("1e3"),
          "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
          **{f"{s}i": Decimal(2 ** (10 * (n + 1))) for n, s in enumerate("KMGTPE")}}


def quantity_value(value: str | int) -> Decimal:
    """The number a valid quantity (`quantity`) stands for: '2Gi' -> 2147483648, '500m' -> 0.5."""
    return Decimal(value) if isinstance(value, int) else _magnitude(value)


def _magnitude(value: str) -> Decimal:
    """The number a quantity string (QUANTITY) stands for."""
    parts = re.fullmatch(r"\+?([0-9.]+)(.*)", value)
    assert parts is not None  # a QUANTITY
    number, suffix = parts.groups()
    with localcontext(Context(prec=40, Emax=MAX_EXPONENT, Emin=-MAX_EXPONENT)):
        if suffix[:1] in ("e", "E") and suffix not in _SCALE:
            exponent = int(suffix[1:])
            return Decimal(number).scaleb(max(-MAX_EXPONENT, min(MAX_EXPONENT, exponent)))
        return Decimal(number) * _SCALE[suffix]


MAX_EXPONENT = 10**6  # past this a quantity is out of range either way


def image(value: str) -> str:
    if len(value) > 4096 or not IMAGE.match(value):
        raise ValueError(f"{value!r} is not an image reference: [registry[:port]/]repository[:tag][@digest], the "
                         "repository lowercase, no spaces (the distribution reference grammar the container "
                         "runtimes parse)")
    return value


Dns1123Label = Annotated[str, AfterValidator(dns1123_label)]
Dns1123Subdomain = Annotated[str, AfterValidator(dns1123_subdomain)]
QualifiedName = Annotated[str, AfterValidator(qualified_name)]
LabelValue = Annotated[str, AfterValidator(label_value)]
ImageRef = Annotated[str, AfterValidator(image)]
ConfigMapKey = Annotated[str, AfterValidator(config_map_key)]
Annotations = Annotated[dict[QualifiedName, str], AfterValidator(annotations_within)]
