"""Tier-2 cost model speed, before and after the architecture pass, interleaved, medians.

Usage: python benchmarks/schedule/tier2_speed.py OLD_COSTMODEL_PY
(e.g. /tmp/rhymerl-c474982/tree/workers/scheduling/costmodel.py after benchmarks/old_tree.sh
c474982; that file imports only numpy). Estimates must be identical; times are group_decode_time
over 32 groups x 64 samples x 4 worker counts, closed form (H100 default) and the walked batching
model (max_batch 16; a KV cache of about 17k tokens).
"""
import importlib.util
import statistics
import sys
import time

import numpy as np

from rhymerl.algorithms.scheduling import costmodel as new

spec = importlib.util.spec_from_file_location("old_costmodel", sys.argv[1])
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)

rng = np.random.default_rng(0)
groups = [rng.lognormal(6.0, 0.8, size=64).clip(10, 4000) for _ in range(32)]
def run(mod, kv):
    prof = mod.RooflineProfile(**kv)
    t0 = time.perf_counter()
    for g in groups:
        for w in (1, 2, 4, 8):
            mod.group_decode_time(g, 300.0, w, prof)
    return time.perf_counter() - t0
for kv in ({}, {"max_batch": 16}, {"hbm_bytes": 18e9}):
    a, b = [], []
    for _ in range(7):
        a.append(run(old, kv))
        b.append(run(new, kv))
    same = all(old.group_decode_time(g, 300.0, w, old.RooflineProfile(**kv))
               == new.group_decode_time(g, 300.0, w, new.RooflineProfile(**kv)) for g in groups for w in (1, 2, 4, 8))
    print(f"profile {kv or 'H100 default'}: old median {statistics.median(a)*1e3:.1f} ms, new {statistics.median(b)*1e3:.1f} ms, "
          f"ratio {statistics.median(b)/statistics.median(a):.3f}, identical estimates: {same}")
