"""The chart's Redis password when its values give none: a Secret of a fixed name that the operator
creates once, at start-up, with a random password, and never rewrites.

Why not the chart: a chart that draws a password draws a new one at every render (`helm template`, Argo
CD), changing the Secret under the running Redis and jobs. Why the operator and not an init container of
the Redis pod: the operator already runs in the release's namespace with a ServiceAccount that may create
Secrets; an init container would give the Redis pod, which every job pod reaches, an API token, and add
an image. What it needs on top: `get` on this one Secret (resourceNames), to learn a password it did not
create. Replicas race safely: whoever's create is answered 409 reads the winner's and uses it. The
Secret is read again every `KEEP_EVERY_S` and made again if it is gone (a person rotating the password, a
GitOps prune of an older chart's Secret), so a Redis pod never waits on a missing one for long.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import secrets
import string
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rhymerl.api.k8s_values import config_map_key, dns1123_subdomain
from rhymerl.errors import UserError

log = logging.getLogger(__name__)
SECRET_ENV = "RHYMERL_REDIS_SECRET"  # the Secret's name; unset: nothing to create
KEY_ENV = "RHYMERL_REDIS_SECRET_KEY"
NAMESPACE_ENV = "RHYMERL_NAMESPACE"  # the operator's own namespace (the chart's downward API)
DEFAULT_KEY = "redis-password"
PASSWORD_ALPHABET = string.ascii_letters + string.digits
PASSWORD_LENGTH = 32  # 190 bits
CREATED_BY = "rhymerl.io/created-by"
KEEP_EVERY_S = 60.0
TRIES = 3


@dataclass(frozen=True)
class SecretRef:
    namespace: str
    name: str
    key: str

    def __str__(self) -> str:
        return f"Secret {self.namespace}/{self.name} (key {self.key})"


@dataclass(frozen=True)
class Ensured:
    password: str
    created: bool  # by this call; False: it was there (an earlier start's, another replica's, a person's)


class SecretApi(Protocol):
    async def create_secret(self, namespace: str, body: Mapping[str, Any]) -> bool:
        """Create it; False when one of that name exists (409)."""

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret; None when there is none (404)."""


def from_env(environ: Mapping[str, str]) -> SecretRef | None:
    """The Secret the chart asks for (SECRET_ENV), or None."""
    name = environ.get(SECRET_ENV, "")
    if not name:
        return None
    namespace = environ.get(NAMESPACE_ENV, "")
    if not namespace:
        raise UserError(f"{SECRET_ENV} needs {NAMESPACE_ENV}: the namespace the operator runs in, where the Secret goes")
    key = environ.get(KEY_ENV) or DEFAULT_KEY
    for env, value, check in ((SECRET_ENV, name, dns1123_subdomain), (KEY_ENV, key, config_map_key),
                              (NAMESPACE_ENV, namespace, dns1123_subdomain)):
        try:
            check(value)
        except ValueError as exc:
            raise UserError(f"{env}: {exc}") from None
    return SecretRef(namespace, name, key)


def draw_password() -> str:
    return "".join(secrets.choice(PASSWORD_ALPHABET) for _ in range(PASSWORD_LENGTH))


def manifest(ref: SecretRef, password: str) -> dict[str, Any]:
    # no app.kubernetes.io/instance: Argo CD tracks its objects by that label and would prune this one
    labels = {"app.kubernetes.io/component": "redis", "app.kubernetes.io/part-of": "rhymerl",
              "app.kubernetes.io/managed-by": "rhymerl-operator"}
    note = "the rhymerl operator, at start-up, if absent; never rewritten; not Helm's: kept on helm uninstall"
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": ref.name, "namespace": ref.namespace, "labels": labels,
                         "annotations": {CREATED_BY: note}},
            "data": {ref.key: base64.b64encode(password.encode()).decode()}}


def password_in(secret: Mapping[str, Any], ref: SecretRef) -> str:
    """The password the Secret holds; a clear error when it holds none (the operator never rewrites it)."""
    value = (secret.get("data") or {}).get(ref.key)
    try:
        password = base64.b64decode(value or "", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        password = ""
    if not password:
        raise UserError(f"{ref} exists without a password under that key, and the operator never rewrites it: put "
                        "the password there, or delete the Secret and the operator creates one")
    return password


async def ensure(api: SecretApi, ref: SecretRef, *, draw: Callable[[], str] = draw_password) -> Ensured:
    """The Secret's password, creating the Secret with a drawn one if there is none."""
    for _ in range(TRIES):
        found = await api.read_secret(ref.namespace, ref.name)
        if found is not None:
            return Ensured(password_in(found, ref), created=False)
        password = draw()
        if await api.create_secret(ref.namespace, manifest(ref, password)):
            log.info("created %s with a random password", ref)
            return Ensured(password, created=True)
        log.info("%s: another replica created it first; using theirs", ref)
    raise UserError(f"{ref}: created by someone else and gone again {TRIES} times in a row; is something deleting it?")


async def keep(api: SecretApi, ref: SecretRef, use: Callable[[str], None], *, every_s: float = KEEP_EVERY_S,
               sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Every `every_s`: read the Secret (made again if it is gone) and `use` its password. Runs until cancelled."""
    while True:
        await sleep(every_s)
        try:
            ensured = await ensure(api, ref)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s: cannot read or create it, trying again in %.0f s: %s", ref, every_s, exc)
            continue
        if ensured.created:
            log.warning("%s was gone and is made again with a new password: restart the Redis Deployment and "
                        "the jobs that use it (docs/operations.md, \"The chart's Redis password\")", ref)
        use(ensured.password)
