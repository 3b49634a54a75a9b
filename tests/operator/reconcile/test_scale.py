"""The operator at scale: informers (list pages, 410 Gone, selectors), the cache a pass reads, and leader
election on a Lease with an injected clock."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from operator_harness import Kube

from rhymerl.operator.reconcile.leader import LeaderElector
from rhymerl.operator.reconcile.nodes import trimmed
from rhymerl.operator.reconcile.watch import OURS, Cache, Informer

pytestmark = pytest.mark.asyncio
NS = "team-a"


def _obj(name: str, rv: int, job: str = "alpha", ours: bool = True) -> dict[str, Any]:
    labels = {"app.kubernetes.io/instance": job, **({OURS.split("=")[0]: OURS.split("=")[1]} if ours else {})}
    return {"metadata": {"namespace": NS, "name": name, "resourceVersion": str(rv), "labels": labels}}


class Source:
    """A list+watch API: `pages` served in turn, then `events` (an item that is an int raises that status)."""

    def __init__(self, pages: list[dict[str, Any]], events: list[Any]) -> None:
        self.pages, self.events = pages, events
        self.lists: list[tuple[int, str | None]] = []

    async def list_page(self, plural: str, namespace: str | None, selector: str | None, limit: int,
                        cont: str | None) -> Mapping[str, Any]:
        self.lists.append((limit, cont))
        return self.pages.pop(0)

    async def watch(self, plural: str, namespace: str | None, selector: str | None, resource_version: str,
                    timeout_s: int) -> AsyncIterator[Mapping[str, Any]]:
        while self.events:
            event = self.events.pop(0)
            if event == "end":
                return
            yield event


def _informer(source: Source, seen: list[tuple[str, str]]) -> Informer:
    return Informer(source, "statefulsets", "StatefulSet", NS, OURS,
                    lambda t, o: seen.append((t, o["metadata"]["name"])), api_version="apps/v1", page=2)


async def test_an_informer_lists_page_by_page_and_drops_what_is_not_selected() -> None:
    source = Source([{"metadata": {"resourceVersion": "5", "continue": "c1"}, "items": [_obj("a", 1), _obj("b", 2)]},
                     {"metadata": {"resourceVersion": "5"}, "items": [_obj("c", 3, ours=False)]}], ["end"])
    seen: list[tuple[str, str]] = []
    informer = _informer(source, seen)
    await informer.watch_once()
    assert source.lists == [(2, None), (2, "c1")]
    assert sorted(informer.store) == [(NS, "a"), (NS, "b")]
    assert informer.resource_version == "5" and seen == [("ADDED", "a"), ("ADDED", "b")]


async def test_a_410_gone_lists_again_and_reports_what_went_in_the_gap() -> None:
    source = Source([{"metadata": {"resourceVersion": "5"}, "items": [_obj("a", 1), _obj("b", 2)]},
                     {"metadata": {"resourceVersion": "9"}, "items": [_obj("a", 7)]}],
                    [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}},
                     {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}])
    seen: list[tuple[str, str]] = []
    informer = _informer(source, seen)
    await informer.watch_once()
    assert informer.resource_version is None  # the bookmark moved it to 6, then the 410 dropped it
    await informer.watch_once()
    assert informer.lists == 2 and informer.resource_version == "9"
    assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "b"), ("MODIFIED", "a")]
    assert informer.of_job(NS, "alpha") == [informer.store[(NS, "a")]]


async def test_a_watch_that_replays_what_the_store_holds_wakes_no_job() -> None:
    source = Source([{"metadata": {"resourceVersion": "5"}, "items": [_obj("a", 1)]}],
                    [{"type": "ADDED", "object": _obj("a", 1)}, {"type": "MODIFIED", "object": _obj("a", 6)}, "end"])
    seen: list[tuple[str, str]] = []
    await _informer(source, seen).watch_once()
    assert seen == [("ADDED", "a"), ("MODIFIED", "a")]  # the list's, then version 6: the replay of 1 is no news


async def test_an_event_older_than_the_operators_own_write_does_not_replace_it() -> None:
    source = Source([{"metadata": {"resourceVersion": "5"}, "items": [_obj("a", 1)]}], ["end"])
    informer = _informer(source, [])
    cache = Cache([informer])
    await informer.watch_once()
    cache.wrote("StatefulSet", {**_obj("a", 8), "spec": {"replicas": 0}})  # the response of our write
    informer.apply({"type": "MODIFIED", "object": {**_obj("a", 6), "spec": {"replicas": 3}}})
    assert cache.children("StatefulSet", NS, "alpha") == [{"apiVersion": "apps/v1", **_obj("a", 8),
                                                           "spec": {"replicas": 0}, "kind": "StatefulSet"}]
    cache.stale("StatefulSet", NS, "a")
    assert cache.get("StatefulSet", NS, "a") == (False, None)  # refused with 409: read from the API


class Forbidden(Exception):
    status = 403
    reason = 'nodes is forbidden: User "system:serviceaccount:rhymerl-system:rhymerl" cannot list resource "nodes"'


class ForbiddenSource(Source):
    async def list_page(self, plural: str, namespace: str | None, selector: str | None, limit: int,
                        cont: str | None) -> Mapping[str, Any]:
        self.lists.append((limit, cont))
        raise Forbidden()


async def test_without_leave_to_list_nodes_the_node_informer_says_why_once_and_no_pass_waits_for_it(
        caplog: pytest.LogCaptureFixture) -> None:
    source = ForbiddenSource([], [])
    nodes = Informer(source, "nodes", "Node", None, None, lambda t, o: None, api_version="v1",
                     transform=trimmed, optional=True)
    cache = Cache([nodes])
    await nodes.run()  # returns: a forbidden optional informer stops instead of retrying
    await cache.synced()
    assert len(source.lists) == 1 and not nodes.synced
    assert cache.get("Node", "", "node-1") == (False, None)  # not known: preemptions come from the pods alone
    assert [r.getMessage() for r in caplog.records] == [
        f"nodes: the operator may not list them (403 Forbidden), so it goes on without them: {Forbidden.reason}"]


async def test_the_node_informer_keeps_only_each_nodes_name_version_and_taints() -> None:
    taint = {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
    node = {"metadata": {"name": "n1", "resourceVersion": "3", "labels": {"zone": "a"}},
            "spec": {"taints": [taint]}, "status": {"images": [{"names": ["x"], "sizeBytes": 1}]}}
    informer = Informer(Source([{"metadata": {"resourceVersion": "3"}, "items": [node]}], ["end"]), "nodes", "Node",
                        None, None, lambda t, o: None, api_version="v1", transform=trimmed, optional=True)
    await informer.watch_once()
    assert informer.store == {("", "n1"): {"metadata": {"name": "n1", "resourceVersion": "3"},
                                           "spec": {"taints": [taint]}, "apiVersion": "v1", "kind": "Node"}}


async def test_a_pass_at_rest_makes_no_api_call_and_reads_its_own_writes(kube: Kube) -> None:
    async with kube.operator() as running:
        await kube.create_job(NS, "alpha")
        await kube.settle()
        cluster = running.op.cluster
        assert cluster.cache is not None and kube.children(NS, "alpha")
        before = len(kube.server._requests)
        stored = copy.deepcopy({kind: [i.store for i in group] for kind, group in cluster.cache.informers.items()})
        await running.resync()
        await running.resync()
        assert running.op.passes >= 2 and len(kube.server._requests) == before  # through the emulator
        # a pass reads the cache's own objects (no copies): it never changes them
        assert {kind: [i.store for i in group] for kind, group in cluster.cache.informers.items()} == stored
        job = kube.job(NS, "alpha")
        assert job is not None
        cached = await running.call(lambda: cluster.get_job(NS, "alpha"))
        assert cached is not None and cached["status"] == job["status"]  # the status patch's own response


class Leases:
    """One Lease, as the API server keeps it (409 on a stale resourceVersion)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.lease

    async def write_lease(self, namespace: str, body: Mapping[str, Any], create: bool) -> dict[str, Any]:
        current = (self.lease or {}).get("metadata", {}).get("resourceVersion")
        if create != (self.lease is None) or (not create and body["metadata"]["resourceVersion"] != current):
            raise RuntimeError("409 Conflict")
        self.version += 1
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        return self.lease


async def test_of_two_replicas_one_leads_and_the_other_takes_over_once_the_lease_lapses() -> None:
    leases, now = Leases(), [1000.0]
    a = LeaderElector(leases, NS, "a", clock=lambda: now[0])
    b = LeaderElector(leases, NS, "b", clock=lambda: now[0])
    assert await a.try_once() and not await b.try_once()
    now[0] += 14.0  # a renews within the lease duration (15 s): b waits on
    assert await a.try_once() and not await b.try_once()
    now[0] += 14.9  # a stopped renewing; b saw the record change 14.9 s ago
    assert not await b.try_once()
    now[0] += 0.1
    assert await b.try_once()
    assert leases.lease is not None and leases.lease["spec"]["holderIdentity"] == "b"
    assert leases.lease["spec"]["leaseTransitions"] == 1
    assert not await a.try_once() and not a.leading


async def test_a_leader_that_cannot_renew_steps_down_before_anyone_may_take_over() -> None:
    leases, now = Leases(), [0.0]
    a = LeaderElector(leases, NS, "a", clock=lambda: now[0])
    assert await a.try_once()

    async def broken(namespace: str, name: str) -> dict[str, Any] | None:
        raise TimeoutError("API server unreachable")

    leases.get_lease = broken  # type: ignore[method-assign]
    now[0] += 9.9
    assert await a.try_once()  # within the renew deadline (10 s)
    now[0] += 0.1
    assert not await a.try_once()


async def test_a_replica_that_stops_releases_the_lease_to_the_other_at_once() -> None:
    leases, now = Leases(), [0.0]
    a = LeaderElector(leases, NS, "a", clock=lambda: now[0])
    b = LeaderElector(leases, NS, "b", clock=lambda: now[0])
    assert await a.try_once() and not await b.try_once()
    await a.release()
    assert await b.try_once()


async def test_leader_election_refuses_a_renew_deadline_longer_than_the_lease() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        LeaderElector(Leases(), NS, "a", duration_s=10, renew_deadline_s=15)


class NoJobs:
    """What a pass needs of a cluster whose job is gone: each pass reads it once."""

    def __init__(self) -> None:
        from collections import Counter

        self.writes: Counter[tuple[str, str]] = Counter()
        self.cache = None
        self.reads = 0

    async def get_job(self, namespace: str, name: str) -> None:
        self.reads += 1

    async def list_jobs(self, namespaces: Any) -> list[dict[str, Any]]:
        return []


async def test_only_the_replica_that_holds_the_lease_runs_passes() -> None:
    from rhymerl.operator.reconcile.handlers import Operator

    leases, now = Leases(), [0.0]
    await LeaderElector(leases, NS, "other", clock=lambda: now[0]).try_once()
    cluster = NoJobs()
    op = Operator(cluster, [NS], cached=False,  # type: ignore[arg-type]
                  elector=LeaderElector(leases, NS, "me", clock=lambda: now[0]))
    assert op.elector is not None and not await op.elector.try_once()
    op.kick(NS, "alpha")
    await op.idle()
    assert cluster.reads == 0
    now[0] += 15.0
    assert await op.elector.try_once()  # took over: every job marked dirty meanwhile gets its pass
    await op.idle()
    assert cluster.reads == 1
