"""Weights over a gloo broadcast (workers/roles/weight_sync.py): what receivers stage is bit-identical
to what the sender holds, in buckets, with tied tensors, as the fleet changes between transfers."""

from __future__ import annotations

import threading

import pytest
import torch

from rhymerl.workers.roles import weight_sync
from rhymerl.workers.roles.weight_sync import Group, Layout, WeightReceiver, WeightSender


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
    assert len(layout.buckets()) >= 4
    assert all(len({layout.tensors[i][2] for i in b}) == 1 for b in layout.buckets())
    sender = WeightSender()
    a, b, c = WeightReceiver(), WeightReceiver(), WeightReceiver()
    fleet = Group(sender.host, sender.port, "fleet-1", 3)
    for version in (1, 2):  # the same members: the same group, used again
        weights = _weights(version)
        _transfer(sender, [a, b], fleet, version, weights)
        for r in (a, b):
            got = r.take(version, timeout=1)
            assert got is not None and got.keys() == weights.keys()
            assert all(torch.equal(got[k], weights[k]) and got[k].dtype == weights[k].dtype for k in weights)
            assert got["lm_head.weight"] is got["embed.weight"]
    # c joins: the current version through a group of its own, then a new fleet group of three
    _transfer(sender, [c], Group(sender.host, sender.port, "join-1", 2), 2, _weights(2))
    got = c.take(2, timeout=1)
    assert got is not None and torch.equal(got["layer.1.w"], _weights(2)["layer.1.w"])
    _transfer(sender, [a, b, c], Group(sender.host, sender.port, "fleet-2", 4), 3, _weights(3))
    assert all(torch.equal(r.take(3, timeout=1)["layer.0.w"], _weights(3)["layer.0.w"])  # type: ignore[index]
               for r in (a, b, c))


def test_a_version_that_never_arrives_is_none_after_the_wait() -> None:
    assert WeightReceiver().take(7, timeout=0.01) is None
