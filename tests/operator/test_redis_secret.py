"""The chart's Redis Secret as the operator keeps it (operator/reconcile/redis_secret.py): created once with
a random password when absent, never rewritten, a lost create race (409) settled by using the winner's,
made again when gone; against a fake API whose answers each test forces."""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
from collections.abc import Callable
from typing import Any

import pytest

from rhymerl.errors import UserError
from rhymerl.operator.reconcile import redis_secret
from rhymerl.operator.reconcile.redis_secret import (
    KEY_ENV,
    NAMESPACE_ENV,
    SECRET_ENV,
    SecretRef,
    draw_password,
    ensure,
    from_env,
    keep,
    manifest,
)

REF = SecretRef("rl", "rhymerl-redis", "redis-password")


def _password(secret: dict[str, Any]) -> str:
    return base64.b64decode(secret["data"][REF.key]).decode()


class FakeSecrets:
    """SecretApi over a dict; `before_create` plays whoever acts between a read and a create."""

    def __init__(self, before_create: Callable[[FakeSecrets], None] | None = None) -> None:
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[str] = []
        self.before_create = before_create

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append("get")
        found = self.stored.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def create_secret(self, namespace: str, body: Any) -> bool:
        self.calls.append("create")
        if self.before_create is not None:
            self.before_create(self)
        key = (namespace, body["metadata"]["name"])
        if key in self.stored:
            return False
        self.stored[key] = copy.deepcopy(body)
        return True


@pytest.mark.asyncio
async def test_a_missing_secret_is_created_once_with_a_random_password_and_then_only_read() -> None:
    api = FakeSecrets()
    first = await ensure(api, REF)
    assert first.created and len(first.password) == 32 and first.password.isalnum()
    stored = api.stored["rl", "rhymerl-redis"]
    assert _password(stored) == first.password and stored["type"] == "Opaque"
    again = await ensure(api, REF)
    assert (again.password, again.created) == (first.password, False)
    assert api.calls == ["get", "create", "get"]
    assert len({draw_password() for _ in range(20)}) == 20


@pytest.mark.asyncio
async def test_a_replica_whose_create_is_answered_409_uses_the_secret_the_other_replica_made() -> None:
    theirs = manifest(REF, "the-other-replicas-password")

    def other_replica_wins(api: FakeSecrets) -> None:
        api.stored.setdefault(("rl", "rhymerl-redis"), theirs)

    api = FakeSecrets(other_replica_wins)
    mine = await ensure(api, REF, draw=lambda: "mine-never-stored")
    assert (mine.password, mine.created) == ("the-other-replicas-password", False)
    assert api.stored["rl", "rhymerl-redis"] == theirs and api.calls == ["get", "create", "get"]


class Scripted(FakeSecrets):
    """Each create answered as `creates` says: False is a 409 for a Secret someone else made and deleted
    again before our read."""

    def __init__(self, creates: list[bool]) -> None:
        super().__init__()
        self.creates = creates

    async def create_secret(self, namespace: str, body: Any) -> bool:
        self.calls.append("create")
        if not self.creates.pop(0):
            return False
        self.stored[namespace, body["metadata"]["name"]] = copy.deepcopy(body)
        return True


@pytest.mark.asyncio
async def test_a_secret_gone_again_after_the_409_is_created_on_the_next_try_and_endless_churn_is_an_error() -> None:
    api = Scripted([False, True])
    created = await ensure(api, REF, draw=lambda: "ours")
    assert (created.password, created.created) == ("ours", True)
    assert api.calls == ["get", "create", "get", "create"]
    churn = Scripted([False] * 3)
    with pytest.raises(UserError, match="gone again 3 times"):
        await ensure(churn, REF)
    assert churn.calls == ["get", "create"] * 3


@pytest.mark.asyncio
async def test_a_secret_without_the_password_key_is_refused_naming_it_and_never_rewritten() -> None:
    api = FakeSecrets()
    api.stored["rl", "rhymerl-redis"] = {"data": {"password": base64.b64encode(b"x").decode()}}
    with pytest.raises(UserError) as refused:
        await ensure(api, REF)
    assert "Secret rl/rhymerl-redis (key redis-password)" in str(refused.value)
    assert api.calls == ["get"] and api.stored["rl", "rhymerl-redis"]["data"].keys() == {"password"}


def test_the_secret_is_named_by_the_environment_and_bad_names_are_refused_naming_the_variable() -> None:
    assert from_env({}) is None
    assert from_env({SECRET_ENV: "r-redis", NAMESPACE_ENV: "rl"}) == SecretRef("rl", "r-redis", "redis-password")
    assert from_env({SECRET_ENV: "r-redis", NAMESPACE_ENV: "rl", KEY_ENV: "pw"}) == SecretRef("rl", "r-redis", "pw")
    with pytest.raises(UserError, match=NAMESPACE_ENV):
        from_env({SECRET_ENV: "r-redis"})
    with pytest.raises(UserError, match=f"^{SECRET_ENV}: 'R_Redis' is not a DNS-1123 subdomain"):
        from_env({SECRET_ENV: "R_Redis", NAMESPACE_ENV: "rl"})
    with pytest.raises(UserError, match=f"^{KEY_ENV}: 'a/b'"):
        from_env({SECRET_ENV: "r-redis", NAMESPACE_ENV: "rl", KEY_ENV: "a/b"})


class _Stop(Exception):
    pass


@pytest.mark.asyncio
async def test_the_keeper_makes_a_deleted_secret_again_and_hands_on_the_new_password_never_logging_it(
        caplog: pytest.LogCaptureFixture) -> None:
    api = FakeSecrets()
    first = await ensure(api, REF)
    used: list[str] = []
    rounds: list[float] = []

    async def sleep(seconds: float) -> None:
        rounds.append(seconds)
        if len(rounds) == 2:
            api.stored.clear()  # a person deletes it to rotate the password
        if len(rounds) == 3:
            raise _Stop
        await asyncio.sleep(0)

    caplog.set_level(logging.INFO, logger=redis_secret.__name__)
    with pytest.raises(_Stop):
        await keep(api, REF, used.append, every_s=60.0, sleep=sleep)
    assert rounds == [60.0] * 3
    assert used[0] == first.password and used[1] != first.password
    assert used[1] == _password(api.stored["rl", "rhymerl-redis"])
    assert "made again with a new password" in caplog.text
    assert not any(p in caplog.text for p in used)


@pytest.mark.asyncio
async def test_the_keeper_goes_on_after_a_failed_round() -> None:
    api = FakeSecrets()
    await ensure(api, REF)
    failing = [True]
    used: list[str] = []

    async def read_secret(namespace: str, name: str) -> dict[str, Any] | None:
        if failing.pop() if failing else False:
            raise UserError("the operator may not get the Secret")
        return await FakeSecrets.read_secret(api, namespace, name)

    api.read_secret = read_secret  # type: ignore[method-assign]
    rounds: list[int] = []

    async def sleep(_: float) -> None:
        rounds.append(1)
        if len(rounds) == 3:
            raise _Stop

    with pytest.raises(_Stop):
        await keep(api, REF, used.append, sleep=sleep)
    assert len(used) == 1, "the failed round used nothing, the next one the stored password"
