"""Rollout bench before (c474982) and after the architecture pass: per (workload, method), the
median of all timed runs of both interleaved rounds, and whether the outputs were identical.
Usage: python side_by_side.py OLD_1 NEW_1 OLD_2 NEW_2 (the --out folders, in the order they ran)."""
import json
import statistics
import sys
from pathlib import Path

folders = sys.argv[1:]
old = [json.loads(Path(f"{f}/results.json").read_text()) for f in folders[0::2]]
new = [json.loads(Path(f"{f}/results.json").read_text()) for f in folders[1::2]]

def runs(results, batch, method):
    rows = [r for res in results for r in res if r["batch"] == batch and r["method"] == method]
    return [t for r in rows for t in r["runs"]], rows

print("| workload | method | s before | s after | after/before | speedup over plain before | after | tokens/pass before | after | identical |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in new[0]:
    b, m = r["batch"], r["method"]
    (ta, ra), (tb, rb) = runs(old, b, m), runs(new, b, m)
    pa, _ = runs(old, b, "none")
    pb, _ = runs(new, b, "none")
    a_s, b_s = statistics.median(ta), statistics.median(tb)
    print(f"| {b} | {m} | {a_s:.2f} | {b_s:.2f} | {b_s / a_s:.2f} | {statistics.median(pa) / a_s:.2f} | "
          f"{statistics.median(pb) / b_s:.2f} | {statistics.median(x['tokens_per_pass'] for x in ra):.2f} | "
          f"{statistics.median(x['tokens_per_pass'] for x in rb):.2f} | {all(x['identical'] for x in ra + rb)} |")
