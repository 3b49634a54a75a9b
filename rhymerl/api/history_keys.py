"""Where a job's rollout history lives in a shared Redis, and how its password reaches a process:
a contract between the history store the pods write (rhymerl.workers.history.redis_store) and the
operator's finalizer that deletes it when the RLJob goes (rhymerl.operator.reconcile.history).

Every key of one run of job `<job>` in namespace `<namespace>` starts with
`rhymerl:<namespace>:<job>:<run_id>:`. Jobs, and runs of one job, share a Redis: a run touches (and
its own cleanup deletes) its run's prefix only; the finalizer deletes the job's prefix, every run.

`history.redis_url` is checked here, once, for `rhymerl validate`, the operator and every worker: a
password never travels in it (the spec is stored in a ConfigMap, spec.yaml and events.log), and any
message shows a URL through rhymerl.api.credentials.masked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rhymerl.api.credentials import secret_query_name

REDIS_PASSWORD_ENV = "RHYMERL_REDIS_PASSWORD"
"""The Redis password, given to pods from `history.redis_password_secret` (never in the URL: the
spec is stored in a ConfigMap)."""

REDIS_ENDPOINTS_ENV = "RHYMERL_REDIS_ENDPOINTS"
"""The operator's: `host:port,...` of the Redis its own REDIS_PASSWORD_ENV is for (the chart sets
both). A job's URL that names another Redis never gets that password (`serves`)."""

CLUSTER_DOMAIN = "cluster.local"
"""The cluster's DNS domain a service name is qualified with (Kubernetes' default)."""

LOCAL_NAMESPACE = "local"
"""The namespace of a job run by `rhymerl run` whose metadata names none."""

RUN_ID = re.compile(r"^[a-z0-9]{1,32}$")
"""A run id: no ':' and nothing a SCAN pattern reads, so one run's prefix never covers another's."""

SCHEMES = ("redis", "rediss", "unix")
# What redis-py reads from a query and rhymerl lets it: timeouts are rhymerl's own, other names
# would reach the connection as unknown arguments and fail only when a pod connects.
QUERY = {"unix": {"db"}, "redis": set(), "rediss": {"ssl_cert_reqs", "ssl_ca_certs", "ssl_check_hostname"}}
QUERY_VALUES = {"ssl_cert_reqs": ("none", "optional", "required"), "ssl_check_hostname": ("true", "false")}
HOSTNAME = re.compile(r"^[A-Za-z0-9_]([-A-Za-z0-9_.]*[A-Za-z0-9_])?$")  # a DNS name or an IPv4 address
PASSWORD_ADVICE = ("a password does not go in the URL (the spec is stored in a ConfigMap and the run folder): "
                   "in a cluster name its Secret in history.redis_password_secret; locally set "
                   f"{REDIS_PASSWORD_ENV}")


def history_key_prefix(namespace: str, job: str) -> str:
    """`rhymerl:<namespace>:<job>:`, every run of the job; names cannot hold ':' so one job's prefix never
    covers another's."""
    return f"rhymerl:{namespace}:{job}:"


def run_key_prefix(namespace: str, job: str, run_id: str) -> str:
    """`rhymerl:<namespace>:<job>:<run_id>:`, the keys of one run."""
    if not RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r}: expected 1 to 32 lowercase letters and digits")
    return f"{history_key_prefix(namespace, job)}{run_id}:"


def glob_escape(prefix: str) -> str:
    """`prefix` as a literal in a Redis SCAN MATCH pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix)


@dataclass(frozen=True)
class RedisUrl:
    scheme: str
    host: str | None  # None for a unix socket
    port: int | None
    path: str | None  # the socket of a unix URL
    db: int


def _split(url: str) -> tuple[str, str, str, str] | None:
    """(scheme, userinfo or '', host part, the rest from the first '/', '?' or '#') as urllib cuts them;
    None without '://'."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    user, _, host = rest[:end].rpartition("@")
    return scheme, user, host, rest[end:]


def parse_redis_url(url: str) -> RedisUrl:
    """`history.redis_url` as redis-py will read it, or ValueError saying what is wrong; the message never
    holds the URL's password. Refuses what redis-py would take silently and misread (`/abc` as db 0,
    `/1/2` as db 12, unknown query names) and a password in the URL (PASSWORD_ADVICE). Parsed by hand:
    rhymerl.api stays free of I/O libraries (urllib), for the pure libraries that read the spec."""
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError("spaces or control characters in the URL")
    parts = _split(url)
    if parts is None or parts[0] not in SCHEMES:
        named = f" (not {parts[0]!r})" if parts and re.fullmatch(r"[A-Za-z][-+.A-Za-z0-9]{0,19}", parts[0]) else ""
        raise ValueError(f"expected redis://host:port/db, rediss://host:port/db or unix:///path/to/socket{named}")
    scheme, user, host, rest = parts
    if ":" in user:
        raise ValueError(PASSWORD_ADVICE)
    rest, hashed, _ = rest.partition("#")
    if hashed:
        raise ValueError("a '#...' fragment means nothing to Redis")
    path, _, query_text = rest.partition("?")
    query = _query(scheme, query_text)
    if scheme == "unix":
        if host:
            raise ValueError("a unix URL names no host: unix:///path/to/socket")
        if not path.startswith("/") or path == "/":
            raise ValueError("expected unix:///path/to/socket")
        return RedisUrl(scheme, None, None, path, _db(query.get("db", "0")))
    name, port = _host_port(host, scheme)
    if path not in ("", "/") and not re.fullmatch(r"/[0-9]+", path):
        raise ValueError("the database goes after the host as /N, N a non-negative integer (e.g. /0)")
    return RedisUrl(scheme, name, port, None, _db(path.strip("/") or "0"))


def endpoint(host: str, port: int, namespace: str) -> tuple[str, int]:
    """`host:port` as a pod in `namespace` reaches it, a service name qualified the way cluster DNS
    resolves it from there (`redis` -> `redis.<namespace>.svc.cluster.local`, `redis.team` ->
    `redis.team.svc.cluster.local`); an address or another name as written, lowercase."""
    host = host.lower().rstrip(".")
    labels = host.split(".")
    if re.fullmatch(r"[0-9.]+|\[[0-9a-f:.]+\]", host):
        return host, port
    if len(labels) == 1:
        host = f"{host}.{namespace}.svc.{CLUSTER_DOMAIN}"
    elif len(labels) == 2:
        host = f"{host}.svc.{CLUSTER_DOMAIN}"
    elif labels[-1] == "svc":
        host = f"{host}.{CLUSTER_DOMAIN}"
    return host, port


def serves(endpoints: str, url: str, namespace: str) -> bool:
    """Whether the job's history `url`, seen from `namespace`, names one of `endpoints` (REDIS_ENDPOINTS_ENV:
    `host:port,...`, fully qualified or relative to no namespace): where the operator's own Redis
    password may go. A unix socket or a URL that does not parse never does."""
    try:
        parsed = parse_redis_url(url)
    except ValueError:
        return False
    if parsed.host is None or parsed.port is None:
        return False
    known = set()
    for item in filter(None, (e.strip() for e in endpoints.split(","))):
        host, _, port = item.rpartition(":")
        if host and port.isdigit():
            known.add(endpoint(host, int(port), "default"))
    return endpoint(parsed.host, parsed.port, namespace) in known


def connect_problem(url: str, exc: BaseException) -> str:
    """What a message may say of `exc`, raised connecting to `url`: its first line, or for redis-py's
    refusal of the URL itself (a ValueError or TypeError, which may quote a part of it, such as a path
    read as the database number) parse_redis_url's reason."""
    if isinstance(exc, (ValueError, TypeError)):
        try:
            parse_redis_url(url)
        except ValueError as refused:
            return f"not a Redis URL: {refused}"
        return "redis-py refused the URL"
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else 'no answer'}"


def _query(scheme: str, text: str) -> dict[str, str]:
    query: dict[str, str] = {}
    for item in filter(None, text.split("&")):
        name, _, value = item.partition("=")
        if name not in QUERY[scheme] and secret_query_name(name):
            raise ValueError(PASSWORD_ADVICE)
        if name not in QUERY[scheme]:
            allowed = ", ".join(sorted(QUERY[scheme])) or "none"
            raise ValueError(f"query parameter {name[:40]!r} is not one rhymerl passes on ({scheme}:// takes "
                             f"{allowed})")
        if name in query:
            raise ValueError(f"query parameter {name!r} given twice")
        if name in QUERY_VALUES and value.lower() not in QUERY_VALUES[name]:
            raise ValueError(f"query parameter {name!r} takes one of {', '.join(QUERY_VALUES[name])}")
        query[name] = value
    return query


def _host_port(text: str, scheme: str) -> tuple[str, int]:
    """Host and port of `host`, `host:port`, `[v6]` or `[v6]:port`; the port 6379 when not given."""
    if text.startswith("["):
        name, closed, after = text[1:].partition("]")
        if not closed or not re.fullmatch(r"[0-9A-Fa-f:.]+", name) or ":" not in name or \
                (after and not after.startswith(":")):
            raise ValueError("an IPv6 host is written [address], e.g. [::1]:6379")
        port_text = after[1:]
    else:
        name, _, port_text = text.partition(":")
        if not name:
            raise ValueError(f"no host: expected {scheme}://host:port/db")
        if not HOSTNAME.match(name):
            raise ValueError(f"host {name[:64]!r} is not a host name or IP address")
    if not port_text:
        return name, 6379
    if not re.fullmatch(r"[0-9]{1,5}", port_text) or not 1 <= int(port_text) <= 65535:
        raise ValueError("the port must be a number from 1 to 65535")
    return name, int(port_text)


def _db(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,9}", text):
        raise ValueError("the database number must be a non-negative integer")
    return int(text)
