"""The scale bench's simulator costs: weight sync gates rollout, history shipping holds workers,
pipelining hides training; each checked on a small fleet against what the costs must do."""

from __future__ import annotations

from rhymerl.tools.bench.scale import BANDWIDTHS, ScaleConfig, run_scale


def test_weight_sync_and_index_shipping_cost_what_their_bytes_and_bandwidth_say() -> None:
    cfg = ScaleConfig(workers=(2,), steps=3, train_time_s=30.0, weight_bytes=1.5e9)
    cells = {(c.pipeline, c.network): c for c in run_scale(cfg)}
    sync_none = cells[("synchronous", "none")]
    sync_slow = cells[("synchronous", "ray-serialised")]
    sync_fast = cells[("synchronous", "rdma-100g")]
    slow_sync_s = 1.5e9 / BANDWIDTHS["ray-serialised"]
    assert sync_slow.weight_sync_s == slow_sync_s == 100.0
    # synchronous: every step waits for the previous step's weights, so the sync adds to each step
    assert sync_slow.step_s >= sync_none.step_s + 0.9 * slow_sync_s
    assert sync_none.step_s <= sync_fast.step_s < sync_none.step_s + 1.0
    # indexes are shipped only where the network is priced, and waited for longer on the slow one
    assert sync_none.index_mb == 0.0 and sync_fast.index_mb > 0.0
    assert sync_slow.index_wait_s > sync_fast.index_wait_s >= 0.0
    # off-policy 1 overlaps training with the next rollout
    assert cells[("off-policy 1", "none")].step_s < sync_none.step_s
