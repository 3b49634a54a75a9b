"""The chart's Redis Secret over HTTP, against kmock's API server (operator/reconcile/redis_secret_rest.py):
the operator's start creates it or reads it, loses a create race (409) to another replica and uses theirs,
and stops naming the permission it lacks."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import kmock
import pytest
import pytest_asyncio
from kubernetes.aio.client import ApiClient, Configuration

from rhymerl.api.history_keys import REDIS_PASSWORD_ENV
from rhymerl.errors import UserError
from rhymerl.operator.reconcile.redis_secret import NAMESPACE_ENV, SECRET_ENV, SecretRef, ensure, manifest
from rhymerl.operator.reconcile.redis_secret_rest import RestSecrets, chart_redis_password

REF = SecretRef("rl", "rhymerl-redis", "redis-password")
SECRETS = "v1/secrets"


@pytest_asyncio.fixture
async def server() -> AsyncIterator[kmock.KubernetesEmulator]:
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
        emulator.resources[SECRETS] = {}
        yield emulator


@pytest_asyncio.fixture
async def api(server: kmock.KubernetesEmulator) -> AsyncIterator[ApiClient]:
    async with ApiClient(Configuration(host=str(server.url))) as client:
        yield client


def stored_password(server: kmock.KubernetesEmulator) -> str:
    secret = server.objects[SECRETS, REF.namespace, REF.name]
    return base64.b64decode(secret["data"][REF.key]).decode()


@pytest.mark.asyncio
async def test_the_operator_start_creates_the_secret_once_and_a_restart_keeps_its_password(
        server: kmock.KubernetesEmulator, api: ApiClient) -> None:
    environ = {SECRET_ENV: REF.name, NAMESPACE_ENV: REF.namespace}
    async with chart_redis_password(api, environ):
        password = environ[REDIS_PASSWORD_ENV]
        assert password == stored_password(server) and len(password) == 32
    restarted = {SECRET_ENV: REF.name, NAMESPACE_ENV: REF.namespace}
    async with chart_redis_password(api, restarted):
        assert restarted[REDIS_PASSWORD_ENV] == password == stored_password(server)
    assert [r.method for r in server if r.method == "POST"] == ["POST"]


@pytest.mark.asyncio
async def test_a_replica_whose_create_is_answered_409_over_http_uses_the_other_replicas_password(
        server: kmock.KubernetesEmulator, api: ApiClient) -> None:
    def other_replica_creates_first() -> str:  # between this replica's read (404) and its create
        server.objects[SECRETS, REF.namespace, REF.name] = manifest(REF, "the-other-replicas")
        return "this-replicas"

    ensured = await ensure(RestSecrets(api), REF, draw=other_replica_creates_first)
    assert (ensured.password, ensured.created) == ("the-other-replicas", False)
    assert stored_password(server) == "the-other-replicas"
    assert [r.method for r in server] == ["GET", "POST", "GET"], "read (404), create (409), read theirs"


@pytest.mark.asyncio
async def test_a_start_without_the_permission_to_read_the_secret_stops_naming_it(
        server: kmock.KubernetesEmulator, api: ApiClient) -> None:
    server[f"get /api/v1/namespaces/{REF.namespace}/secrets/{REF.name}"] << 403 << {"kind": "Status", "code": 403}
    environ = {SECRET_ENV: REF.name, NAMESPACE_ENV: REF.namespace}
    with pytest.raises(UserError, match="may not get the Secret rl/rhymerl-redis: the chart's Role "
                                        "<release>-redis-password grants it"):
        async with chart_redis_password(api, environ):
            pass
    assert REDIS_PASSWORD_ENV not in environ


@pytest.mark.asyncio
async def test_without_the_chart_asking_nothing_is_read_or_created(
        server: kmock.KubernetesEmulator, api: ApiClient) -> None:
    environ: dict[str, str] = {}
    async with chart_redis_password(api, environ):
        pass
    assert environ == {} and list(server) == []
