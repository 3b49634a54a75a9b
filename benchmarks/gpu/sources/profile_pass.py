"""Where a decode pass's time goes: cProfile of the torch engine generating the first steps of a
run's next epoch, plain and with HistoSpec, on one device (GPU time shows up inside the calls that
wait for it: `tolist`, boolean indexing).

python benchmarks/gpu/sources/profile_pass.py RUN --device cuda --steps 3 > profile.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import threading
import time
from pathlib import Path

import torch

from rhymerl.tools.bench.rollout import _sources, method_spec
from rhymerl.tools.bench.workload import load_run_workload
from rhymerl.workers.reward.pool import open_scorer
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.speculators import DraftCapController
from rhymerl.workers.rollout.verify_cost import measure


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--methods", default="none,history")
    ap.add_argument("--callees", default="", help="also list what this function calls, by cumulative time")
    args = ap.parse_args()
    print("threads:", [t.name for t in threading.enumerate()])
    w = load_run_workload(args.run)
    model = w.native.to(args.device)
    profile = measure(model, batches=(1, 4, 16, 64))
    engine = TorchEngine(model, w.tokenizer.eos_id, max_batch_size=w.job.spec.rollout.max_batch_size,
                         device=args.device)
    with open_scorer(w.job.spec.reward) as scorer:
        for method in ["none", *args.methods.split(",")]:  # the first "none" warms up
            spec = method_spec(method, w.job.spec.rollout.speculation)
            control = DraftCapController(spec, profile)
            drafting = {v: w.drafting(scorer, reward_weighted=v) for v in (True, False)}
            prof = cProfile.Profile()
            passes = tokens = 0
            t0 = time.perf_counter()
            prof.enable()
            for i, chunk in enumerate(w.steps()[: args.steps]):
                indexes = {v: d.before(i) for v, d in drafting.items()}
                results = engine.generate(chunk, w.params, _sources(method, spec, indexes, control))
                prof.disable()
                for d in drafting.values():
                    d.generated(i, results)
                prof.enable()
                tokens += sum(len(r.response_ids) for r in results)
                passes += sum(r.forward_passes for r in results)
            prof.disable()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            out = io.StringIO()
            stats = pstats.Stats(prof, stream=out)
            engine_passes = sum(v[1] for k, v in stats.stats.items() if k[2] == "_verify")  # type: ignore[attr-defined]
            stats.sort_stats("tottime").print_stats(22)
            if args.callees:
                stats.sort_stats("cumtime").print_callees(args.callees)
                stats.sort_stats("cumtime").print_stats(25)
            print(f"=== {method}: {wall:.2f} s, {tokens} tokens, {tokens / max(passes, 1):.2f} tokens per sequence "
                  f"pass, {engine_passes} engine passes, {1e3 * wall / max(engine_passes, 1):.2f} ms each")
            print(out.getvalue())


if __name__ == "__main__":
    main()
