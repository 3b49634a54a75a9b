"""Weights over a gloo broadcast (workers/roles/weight_sync.py): what receivers stage is bit-identical
to what the sender holds, in buckets, with tied tensors, as the fleet changes between transfers."""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Callable

import pytest
import torch

from rhymerl.workers.controller.weight_broadcast import WeightBroadcast
from rhymerl.workers.roles import weight_sync
from rhymerl.workers.roles.weight_layout import Group, Layout
from rhymerl.workers.roles.weight_sync import WeightReceiver, WeightSender, buckets


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(50, 8, generator=g)
    return {"embed.weight": embed, "layer.0.w": torch.randn(8, 8, generator=g),
            "layer.0.b": torch.randn(8, generator=g).to(torch.bfloat16), "layer.1.w": torch.randn(8, 8, generator=g),
            "lm_head.weight": embed}


def _transfer(sender: WeightSender, receivers: list[WeightReceiver], group: Group, version: int,
              weights: dict[str, torch.Tensor]) -> None:
    layout = Layout.of(weights)
    threads = [threading.Thread(target=r.receive, args=(version, group, rank + 1, layout))
               for rank, r in enumerate(receivers)]
    for t in threads:
        t.start()
    sender.send(group, weights)
    for t in threads:
        t.join(timeout=60)


def test_receivers_stage_bit_identical_weights_through_buckets_and_new_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weight_sync, "BUCKET_BYTES", 300)  # several buckets per dtype
    layout = Layout.of(_weights(0))
    assert layout.aliases == (("lm_head.weight", "embed.weight"),)
    assert len(buckets(layout)) >= 4
    assert all(len({layout.tensors[i][2] for i in b}) == 1 for b in buckets(layout))
    sender = WeightSender()
    a, b, c = WeightReceiver(), WeightReceiver(), WeightReceiver()
    for version in (1, 2):  # a group per transfer
        weights = _weights(version)
        _transfer(sender, [a, b], Group(sender.host, sender.port, f"fleet-{version}", 3), version, weights)
        for r in (a, b):
            got = r.take(version, timeout=1)
            assert got is not None and got.keys() == weights.keys()
            assert all(torch.equal(got[k], weights[k]) and got[k].dtype == weights[k].dtype for k in weights)
            assert got["lm_head.weight"] is got["embed.weight"]
    # c joins: the current version through a group of its own, then a new fleet group of three
    _transfer(sender, [c], Group(sender.host, sender.port, "join-1", 2), 2, _weights(2))
    got = c.take(2, timeout=1)
    assert got is not None and torch.equal(got["layer.1.w"], _weights(2)["layer.1.w"])
    _transfer(sender, [a, b, c], Group(sender.host, sender.port, "fleet-3", 4), 3, _weights(3))
    assert all(torch.equal(r.take(3, timeout=1)["layer.0.w"], _weights(3)["layer.0.w"])  # type: ignore[index]
               for r in (a, b, c))


def test_a_version_that_never_arrives_is_none_after_the_wait() -> None:
    assert WeightReceiver().take(7, timeout=0.01) is None


def test_a_transfer_that_fails_wakes_the_load_waiting_for_it_and_a_late_one_is_not_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weight_sync, "TIMEOUT", datetime.timedelta(seconds=1))
    sender = WeightSender()
    a = WeightReceiver()
    never_complete = Group(sender.host, sender.port, "fleet-1", 3)  # rank 2 never comes, nor the sender
    failed = threading.Thread(target=lambda: _swallow(a.receive, 1, never_complete, 1, Layout.of(_weights(1))))
    failed.start()
    started = time.monotonic()
    assert a.take(1, timeout=60) is None  # woken by the failure, not by the 60 s
    assert time.monotonic() - started < 30
    failed.join()
    # version 1 came late, after the load moved past it: nothing is staged for it
    _transfer(sender, [a], Group(sender.host, sender.port, "one-2", 2), 1, _weights(1))
    assert a.take(1, timeout=0.01) is None


def test_a_worker_that_went_back_to_an_older_version_takes_a_newer_one_sent_again() -> None:
    """A resumed run at off-policy 1: the worker loads the current version (2) by broadcast, the
    restored in-flight round's version (1) from the object store, then 2 again for the next round,
    which the fleet sends again: it must be staged, not dropped as one the worker moved past."""
    sender, a = WeightSender(), WeightReceiver()
    _transfer(sender, [a], Group(sender.host, sender.port, "one-1", 2), 2, _weights(2))
    assert a.take(2, timeout=1) is not None
    a.loaded(1)
    _transfer(sender, [a], Group(sender.host, sender.port, "one-2", 2), 2, _weights(2))
    again = a.take(2, timeout=0.01)
    assert again is not None and torch.equal(again["layer.0.w"], _weights(2)["layer.0.w"])


def _swallow(fn: object, *args: object) -> None:
    with contextlib.suppress(RuntimeError):
        fn(*args)  # type: ignore[operator]


class _Recording:
    """A transport that records the calls and tells it is asked to make."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def call(self, handle: object, method: Callable[..., object], *args: object) -> object:
        self.sent.append((method.__name__, args[0]))
        return object()

    def tell(self, handle: object, method: Callable[..., object], *args: object) -> None:
        self.sent.append((method.__name__, args[0]))


def test_a_version_the_train_worker_never_published_goes_by_the_object_store_not_a_broadcast() -> None:
    """A resumed run publishes its current version; the in-flight versions its checkpoint restored
    were never handed to the sender, so a broadcast of one would hold its receiver for nothing."""
    t = _Recording()
    broadcast = WeightBroadcast(t, object(), ("127.0.0.1", 1, Layout.of(_weights(0))))  # type: ignore[arg-type]
    broadcast.publish(5, [])
    assert broadcast.carries(5) and not broadcast.carries(4)
    broadcast.publish(6, [(1, "w1")])
    broadcast.publish(7, [(1, "w1")])
    assert [v for v in range(3, 9) if broadcast.carries(v)] == [6, 7]  # the train worker keeps two
    assert t.sent == [("send_weights", 6), ("receive_weights", 6), ("send_weights", 7), ("receive_weights", 7)]
