"""A draft step against a policy pass: one-token cached passes of tiny-arith and tiny-arith-draft,
interleaved, 1 torch thread; ms per pass, median of 200 (benchmarks/draft-model/README.md)."""

import statistics
import time

import torch

from rhymerl.workers.model.folder import model_dir
from rhymerl.workers.model.transformer import KVCache, load_model

torch.set_num_threads(1)
models = {n: load_model(model_dir(f"builtin:{n}")).eval() for n in ("tiny-arith", "tiny-arith-draft")}
with torch.inference_mode():
    for rows in (16, 64):
        times: dict[str, list[float]] = {n: [] for n in models}
        caches = {n: KVCache(m.cfg, rows, 512, torch.float32, torch.device("cpu")) for n, m in models.items()}
        start = torch.full((rows,), 300)  # a context of 300 tokens
        tokens = torch.randint(3, 90, (rows, 1))
        for _ in range(200):
            for n, m in models.items():
                t = time.perf_counter()
                m.forward_cached(tokens, start, caches[n], torch.ones(rows, dtype=torch.int64))
                times[n].append(time.perf_counter() - t)
        med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
        print(rows, {n: round(v, 3) for n, v in med.items()}, "ratio",
              round(med["tiny-arith-draft"] / med["tiny-arith"], 3))
