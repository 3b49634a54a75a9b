"""Median over interleaved repeats of the drafter bench, before (c474982) and after the architecture pass."""
import json
import statistics


def load(kind): return [json.load(open(f"/tmp/drafter_{kind}_{i}/results.json")) for i in (1, 2, 3)]
old, new = load("old"), load("new")
rows = []
print("| source | batch | p50 us before | p50 us after | after/before | acceptance identical |")
print("|---|---|---|---|---|---|")
for src in ("histospec", "n-gram"):
    for k, r in enumerate(new[0]["latency"][src]):
        a = statistics.median(o["latency"][src][k]["p50_us"] for o in old)
        b = statistics.median(n["latency"][src][k]["p50_us"] for n in new)
        same = all(o["latency"][src][k]["tokens_per_step"] == n["latency"][src][k]["tokens_per_step"] for o in old for n in new)
        print(f"| {src} | {r['batch']} | {a:.2f} | {b:.2f} | {b / a:.2f} | {same} |")
a = statistics.median(o["build"]["histospec"]["build_tokens_per_s"] for o in old) / 1e6
b = statistics.median(n["build"]["histospec"]["build_tokens_per_s"] for n in new) / 1e6
print(f"| histospec build | - | {a:.2f} M tok/s | {b:.2f} M tok/s | {b / a:.2f} | - |")
q = all(o["quality"] == n["quality"] for o in old for n in new)
print(f"\ndraft quality tables identical in all 6 runs: {q}")
