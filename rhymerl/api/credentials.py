"""Credentials in an RLJob: which environment literals hold one, and how a URL is shown without one.

Whatever the spec holds is readable by anyone who may read the RLJob, its ConfigMap, the StatefulSets
the operator renders from it or a run folder. A credential belongs in a Secret the pods read
(`valueFrom.secretKeyRef`, `envFrom.secretRef`), so the spec refuses an environment literal that holds
one (`literal_credential`). A URL reaches a message, log line, event, condition or render only
through `masked`, which hides every place a URL can carry a credential in: the user-info (`user:pw@`
and a bare `token@`), the values of secret-named query parameters (`password`, `token`, `sig`,
`X-Amz-*`, ...), the fragment, and a Redis URL's path where a database number belongs.

Parsed by hand, no urllib: rhymerl.api imports no I/O library. The parsing leans towards hiding: a
password holding '/', '?' or '#' still counts as user-info, and text that is not a URL but has an
'@' is not shown at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

HIDDEN = "***"
NOT_SHOWN = "(a URL not shown: it may hold a password)"
SCHEME = re.compile(r"^[A-Za-z][-+.A-Za-z0-9]{0,31}$")
# Words of an environment variable's name that make it a credential (the last word, or any word for
# the ones that mark a credential wherever they stand: AWS_SECRET_ACCESS_KEY, PGPASSWORD).
_ENV_LAST_WORDS = frozenset({"TOKEN", "KEY", "PASSWORD", "PASSWD", "PWD", "PASS", "PASSPHRASE", "SECRET", "APIKEY",
                             "CREDENTIAL", "CREDENTIALS", "SAS"})
_ENV_ANY_WORD = re.compile(r"SECRET|PASSWORD|PASSWD|ACCESS_KEY|API_?KEY|PRIVATE_KEY|CONNECTION_STRING|AUTH_TOKEN")
# A name ending so names a file holding the credential, or a place (HF_TOKEN_PATH, DB_PASSWORD_FILE).
_ENV_NOT_SECRET_LAST = frozenset({"FILE", "PATH", "DIR", "FILENAME", "LOCATION"})
_QUERY_WORDS = frozenset({"password", "passwd", "pwd", "pass", "passphrase", "token", "secret", "key", "apikey",
                          "signature", "sig", "credential", "credentials", "auth", "authorization", "sas", "session"})
_QUERY_PREFIXES = ("x-amz-", "x-goog-", "x-ms-")
_REFERENCE = re.compile(r"^\$\([-._a-zA-Z][-._a-zA-Z0-9]*\)$")  # $(OTHER_VAR): Kubernetes expands it in the pod


@dataclass(frozen=True)
class UrlParts:
    """A URL cut as `masked` reads it; None for a part it does not have (no '@', no '?', no '#')."""

    scheme: str
    userinfo: str | None
    host: str
    path: str
    query: str | None
    fragment: str | None


def split_url(url: str) -> UrlParts | None:
    """`url` in its parts, None without '://'. The user-info ends at the last '@' of the authority, or
    at a later '@' when what comes before it has a ':' (a password holding '/', '?' or '#')."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, end)
    last = rest.rfind("@")
    if last >= end and ":" in rest[:last]:
        at = last
    userinfo, rest = (rest[:at], rest[at + 1:]) if at >= 0 else (None, rest)
    rest, hashed, fragment = rest.partition("#")
    rest, asked, query = rest.partition("?")
    slash = rest.find("/")
    host, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    return UrlParts(scheme, userinfo, host, path, query if asked else None, fragment if hashed else None)


def _words(name: str) -> list[str]:
    """The words of a name, lowercase: split at '-', '_', '.' and a camelCase hump."""
    return [w for w in re.split(r"[-_.]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if w]


def secret_query_name(name: str) -> bool:
    """Whether a query parameter of this name carries a credential (`password`, `access_token`,
    `X-Amz-Signature`, `sig`, `api-key`, `sessionToken`, ...)."""
    return name.lower().startswith(_QUERY_PREFIXES) or any(w in _QUERY_WORDS for w in _words(name))


def secret_query_names(parts: UrlParts) -> list[str]:
    """The secret-named query parameters (`name=value`) of a URL."""
    items = [item.partition("=") for item in (parts.query or "").split("&")]
    return [name for name, eq, _ in items if eq and secret_query_name(name)]


def _masked_query(query: str) -> str:
    out = []
    for item in query.split("&"):
        name, eq, _ = item.partition("=")
        out.append(item if not item or (eq and not secret_query_name(name)) else
                   f"{name}={HIDDEN}" if eq else HIDDEN)
    return "&".join(out)


def _masked_userinfo(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{HIDDEN}" if colon else HIDDEN


def _masked_path(scheme: str, path: str) -> str:
    """A Redis URL's path is its database number and nothing else; any other path is shown."""
    if scheme.lower() in ("redis", "rediss") and not re.fullmatch(r"/?[0-9]*", path):
        return f"/{HIDDEN}"
    return path


def _masked_tail(query: str | None, fragment: str | None) -> str:
    shown = "" if query is None else f"?{_masked_query(query)}"
    return shown + ("" if fragment is None else "#" + (HIDDEN if fragment else ""))


def masked(url: str) -> str:
    """`url` fit for a message, a log line, an event or a render: the user-info's password (`user:***@`)
    or a bare user-info (`***@`, which may be a token), the values of secret-named query parameters,
    the fragment and a Redis URL's path other than `/N` become `***`. Text without '://' is shown as it
    is unless it has an '@' (then not at all); its query and fragment are masked alike. Idempotent."""
    parts = split_url(url)
    if parts is None:
        if "@" in url:
            return NOT_SHOWN
        rest, hashed, fragment = url.partition("#")
        rest, asked, query = rest.partition("?")
        return rest + _masked_tail(query if asked else None, fragment if hashed else None)
    if "@" in parts.scheme:
        return NOT_SHOWN
    user = "" if parts.userinfo is None else f"{_masked_userinfo(parts.userinfo)}@"
    return (f"{parts.scheme}://{user}{parts.host}{_masked_path(parts.scheme, parts.path)}"
            f"{_masked_tail(parts.query, parts.fragment)}")


def url_credential(url: str, user_ok: bool = False) -> str | None:
    """Where `url` carries a credential (the user-info, a secret-named query parameter), None where it
    carries none `masked` would hide there; `user_ok`: a user name alone is not one (a Redis ACL user)."""
    parts = split_url(url)
    if parts is None:
        return None
    if parts.userinfo is not None and (not user_ok or ":" in parts.userinfo):
        return "a password in its user-info" if ":" in parts.userinfo else "a token as its user-info"
    names = secret_query_names(parts)
    return None if not names else f"the query parameter {names[0][:40]!r}"


def secret_env_name(name: str) -> bool:
    """Whether an environment variable of this name holds a credential by its name: HF_TOKEN,
    AWS_SECRET_ACCESS_KEY, AWS_ACCESS_KEY_ID, AWS_SESSION_TOKEN, WANDB_API_KEY, AZURE_CLIENT_SECRET,
    AZURE_STORAGE_CONNECTION_STRING, PGPASSWORD, ...; not one whose name ends in a file's or a place's
    word (HF_TOKEN_PATH, DB_PASSWORD_FILE)."""
    words = [w.upper() for w in _words(name)]
    if not words or words[-1] in _ENV_NOT_SECRET_LAST:
        return False
    last = words[-1] in _ENV_LAST_WORDS and words != ["PWD"]  # PWD alone is the working directory
    return last or bool(_ENV_ANY_WORD.search("_".join(words)))


def literal_credential(name: str, value: str | None) -> str | None:
    """Why the literal `value` of environment variable `name` is a credential, None if it is not one:
    a secret-named variable with a value (not a path, for a CREDENTIALS file variable such as
    GOOGLE_APPLICATION_CREDENTIALS; not only a `$(VAR)` reference to another variable), or a URL
    carrying a password or a secret-named query parameter. Never holds the value."""
    if not value or _REFERENCE.match(value):
        return None
    if secret_env_name(name):
        if "CREDENTIAL" in name.upper() and value.startswith("/") and not any(c.isspace() for c in value):
            return None  # the path of a file on a mounted Secret
        return f"{name} holds a credential (by its name)"
    where = url_credential(value, user_ok=True)
    return None if where is None else f"{name} is a URL with {where}"


def holds_credential(value: Any) -> bool:
    """Whether a value (a `--set` item's, as YAML read it) holds a credential: an environment entry
    (`{name: HF_TOKEN, value: ...}`) with a literal credential, or a string `masked` would change."""
    if isinstance(value, dict):
        name, literal = value.get("name"), value.get("value")
        if isinstance(name, str) and isinstance(literal, str) and literal_credential(name, literal):
            return True
        return any(holds_credential(v) for v in value.values())
    if isinstance(value, list):
        return any(holds_credential(v) for v in value)
    return isinstance(value, str) and masked(value) != value


def masked_set_item(given: str, value: Any) -> str:
    """A `--set key=value` item as a message may show it, `value` its value as YAML read it: a mapping or
    list holding a credential as `***`, a URL masked; an item that is not `key=value` (`key:url`, a
    typo) masked as a URL."""
    key, sep, raw = given.partition("=")
    if not sep or "://" in key or "@" in key:
        return masked(given)
    if not holds_credential(value) and masked(raw) == raw:
        return given
    return f"{key}={masked(raw)}" if isinstance(value, str) else f"{key}={HIDDEN}"
