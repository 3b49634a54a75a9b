"""Seconds of one `fleet_size.recommend` call for 16,384 predicted lengths (lognormal, cut at 20K)
priced on 1..256 workers with the default H100/7B roofline: what the real fleet asks every step
(issue 27). With a path to another version of costmodel.py (e.g. `git show REV:rhymerl/algorithms/
scheduling/costmodel.py > /tmp/old.py`) it times that one too, in the same process, and checks both
give the same advice and the same predicted seconds. Median of `--repeat` calls.

    python benchmarks/schedule/fleet_recommend_speed.py [--repeat 3] [OLD_COSTMODEL.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

import numpy as np

import rhymerl.algorithms.scheduling.fleet_size as fleet_size
from rhymerl.algorithms.scheduling.costmodel import RooflineProfile

parser = argparse.ArgumentParser()
parser.add_argument("old", nargs="?")
parser.add_argument("--repeat", type=int, default=3)
args = parser.parse_args()

lengths = np.minimum(np.random.default_rng(0).lognormal(7.5, 0.9, 16_384), 20_480.0)
versions = {"current": vars(fleet_size)["group_decode_time"]}
if args.old:
    spec = importlib.util.spec_from_file_location("rhymerl.algorithms.scheduling._old_costmodel", args.old)
    assert spec is not None and spec.loader is not None
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old
    spec.loader.exec_module(old)
    versions = {"old": old.group_decode_time, **versions}
advice = {}
for label, fn in versions.items():
    vars(fleet_size)["group_decode_time"] = fn  # what recommend prices with
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        advice[label] = fleet_size.recommend(lengths, 512.0, RooflineProfile(), (1, 256))
        times.append(time.perf_counter() - t0)
    a = advice[label]
    print(f"{label}: {statistics.median(times):.2f} s per call (median of {args.repeat}); "
          f"advice {a.workers} workers ({a.reason})")
if len(advice) == 2:
    same = advice["old"] == advice["current"]
    print("same advice and predicted seconds:", same)
