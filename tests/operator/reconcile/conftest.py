"""Fixtures of the operator tests (helpers in operator_harness.py, the cluster in kube_emulator.py; both
importable under --import-mode=importlib through this folder on sys.path)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import kmock
import pytest
import pytest_asyncio

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from kube_emulator import FIXTURE_AGENT, ApiServer, Cluster  # noqa: E402
from local_servers import redis_server  # noqa: E402
from operator_harness import NAMESPACES, Kube  # noqa: E402


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[Kube]:
    async with ApiServer() as server, kmock.Server(server):
        server.declare(NAMESPACES)
        async with aiohttp.ClientSession(base_url=str(server.url), headers={"User-Agent": FIXTURE_AGENT}) as http:
            yield Kube(server, Cluster(server, http))


@pytest.fixture
def redis_with_password() -> Iterator[tuple[str, str]]:
    with redis_server("s3cret-pw") as url:
        yield url, "s3cret-pw"
