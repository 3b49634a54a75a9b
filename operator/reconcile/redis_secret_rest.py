"""The chart's Redis Secret at the operator's start (redis_secret.py) over the Kubernetes REST API: through
Cluster.request, not Cluster.create_once (which never asks twice) or Cluster.read_secret (which reads a
403 as "none"), because here a missing permission must stop the start saying which one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping, MutableMapping
from typing import Any

from kubernetes.aio.client import ApiClient
from kubernetes.aio.client.exceptions import ApiException

from rhymerl.api.history_keys import REDIS_PASSWORD_ENV
from rhymerl.errors import UserError
from rhymerl.operator.reconcile.cluster import SECRET, Cluster
from rhymerl.operator.reconcile.redis_secret import ensure, from_env, keep

log = logging.getLogger(__name__)


class RestSecrets:
    """SecretApi (redis_secret.py) on `api`, through Cluster's one request path."""

    def __init__(self, api: ApiClient, timeout_s: float = 30.0) -> None:
        self.cluster = Cluster(api, timeout_s)

    async def _call(self, method: str, namespace: str, name: str = "",
                    body: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        try:
            found = await self.cluster.request(method, SECRET.path(namespace, name or None), body=body)
        except ApiException as exc:
            if exc.status == 403:
                what = f"get the Secret {namespace}/{name}" if name else f"create Secrets in namespace {namespace}"
                raise UserError(f"the operator may not {what}: the chart's Role <release>-redis-password grants "
                                "it (rbac.create; docs/operations.md, \"The chart's Redis password\")") from None
            if exc.status in (404, 409):
                return exc.status, None
            raise
        return 200, found if found is not None else {}

    async def create_secret(self, namespace: str, body: Mapping[str, Any]) -> bool:
        status, _ = await self._call("POST", namespace, body=body)
        if status == 404:
            raise UserError(f"namespace {namespace} not found: the Redis password Secret cannot be created there")
        return status != 409

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, secret = await self._call("GET", namespace, name)
        return None if status == 404 else dict(secret)


@contextlib.asynccontextmanager
async def chart_redis_password(api: ApiClient,
                               environ: MutableMapping[str, str] = os.environ) -> AsyncIterator[None]:
    """While it is open, the chart's Redis password (when `environ` names its Secret, redis_secret.py) is
    in `environ` as REDIS_PASSWORD_ENV, where the history cleanup reads it, and the Secret is kept."""
    ref = from_env(environ)
    if ref is None:
        yield
        return
    secrets = RestSecrets(api)

    def use(password: str) -> None:
        environ[REDIS_PASSWORD_ENV] = password

    ensured = await ensure(secrets, ref)
    log.info("the chart's Redis password: %s, %s", ref, "created now" if ensured.created else "as it was")
    use(ensured.password)
    keeper = asyncio.create_task(keep(secrets, ref, use), name="redis-secret")
    try:
        yield
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
